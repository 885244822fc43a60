"""--enable-deterministic-inference: a request's greedy tokens and logprobs do not depend on its batch, so fast
prefill on and off agree when the same requests are batched differently; and every refusal names the fix.

The invariance test runs ``e2b_bench_bf16`` (hidden 256, bf16: every weight above oneDNN's size floor, so the
prepacked bf16 matmul runs as on E2B). Without the mode the same check fails on all four prompts, and with
any one of its three parts removed (the lone-row padding, unsplit decode keys, the row-kernel LM head) on
one to four of them (checked by hand when it was written)."""

from __future__ import annotations

import pytest
import torch

from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.kernels.cpu_fused import linear as cpu_linear
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.engine_outputs import output_logprobs, seeded_prompts

FLAG = "--enable-deterministic-inference"
GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
# a 700-token prompt: its decode keys would be split (the CPU policy splits from 256 keys on)
LENGTHS = (300, 37, 700, 5)
native = pytest.mark.skipif(cpu_linear.plan(torch.bfloat16).mode != "packed",
                            reason="needs oneDNN's prepacked bf16 matmul (native bf16: avx512_bf16 or AMX)")


@native
def test_alone_equals_batched_and_fast_prefill_on_equals_off():
    from impl import Engine

    ps = seeded_prompts(LENGTHS)
    runs = {}
    for flag in (False, True):
        eng = Engine(tiny_checkpoint("e2b_bench_bf16"), kv_sharing_fast_prefill=flag, enable_deterministic_inference=True,
                     chunked_prefill_size=256, random_seed=0)
        try:
            alone = [eng.generate(input_ids=[p], sampling_params=GREEDY, return_logprob=True)[0] for p in ps]
            batched = eng.generate(input_ids=ps, sampling_params=GREEDY, return_logprob=True)
            eng.check_integrity()
            assert "Deterministic inference: on" in "\n".join(eng.runner.describe())
            info = eng.get_server_info()
            assert info["enable_deterministic_inference"] is True and info["cpu_kernels"]["batch_invariant"] is True
        finally:
            eng.shutdown()
        assert [o["output_ids"] for o in alone] == [o["output_ids"] for o in batched]
        assert output_logprobs(alone) == output_logprobs(batched)  # bit for bit: each request's rows ran in other batches
        runs[flag] = (batched, output_logprobs(alone))
    assert [o["output_ids"] for o in runs[False][0]] == [o["output_ids"] for o in runs[True][0]]
    assert runs[False][1] == runs[True][1]


def _args(**kw) -> ServerArgs:
    args = ServerArgs(model_path=tiny_checkpoint("e2b"), enable_deterministic_inference=True, **kw)
    check_server_args(args, platform=Platform.cpu())
    return args


def test_unset_backend_resolves_to_triton():
    args = _args(kv_sharing_fast_prefill=False)
    assert args.resolved().attention_backend == "triton"


@pytest.mark.parametrize("kw,names", [
    (dict(decode_attention_backend="torch_native"), "--decode-attention-backend=torch_native"),
    (dict(attention_backend="torch_native"), "--attention-backend=torch_native"),
])
def test_a_backend_other_than_triton_is_refused(kw, names):
    with pytest.raises(ValueError, match=f"{FLAG} needs the triton attention backend.*{names}"):
        _args(**kw)


def test_speculative_decoding_and_cuda_are_refused():
    with pytest.raises(ValueError, match=f"{FLAG} is not supported with speculative decoding"):
        _args(speculative_algorithm="NEXTN", speculative_draft_model_path=tiny_checkpoint("assistant"))
    args = ServerArgs(model_path=tiny_checkpoint("e2b"), enable_deterministic_inference=True, device="cuda")
    with pytest.raises(ValueError, match=f"{FLAG} is implemented for the CPU here"):
        check_server_args(args, platform=Platform.cpu())


def test_float32_weights_are_refused_before_loading():
    from impl import Engine

    with pytest.raises(ValueError, match=f"{FLAG} needs bf16 weights here .*float32.*--dtype bfloat16"):
        Engine(tiny_checkpoint("e2b"), dtype="float32", enable_deterministic_inference=True)


@native
def test_weights_under_onednns_size_floor_are_refused():
    from impl import Engine

    with pytest.raises(ValueError, match=f"{FLAG} needs every decoder layer on oneDNN's prepacked bf16 matmul"):
        Engine(tiny_checkpoint("e2b"), dtype="bfloat16", enable_deterministic_inference=True)


def test_no_refusal_hook_runs_without_the_flag():
    args = ServerArgs(model_path=tiny_checkpoint("e2b"), decode_attention_backend="torch_native")
    check_server_args(args, platform=Platform.cpu())
    assert "handle_deterministic_attention_backend" not in {r.source for r in resolutions_of(args)}
