"""A bf16 model's W8A16 / W4A16 layers take bf16 dot products in prefill (quant_linear.h's bf16_dot, where the CPU
has AMX-bf16 tiles or AVX-512 BF16): fast prefill keeps every greedy token and logprob bit for bit, because extend
batches pad their rows up to the kernel's first row count (``FusedLayerForward.min_rows``) and the kernel's rows do
not depend on the rows beside them. ``e2b_bench_bf16`` (hidden 256, intermediate 1024: every decoder weight at or
above the small-weight floor, as on E2B); int4 also over an fp8_e4m3 KV pool."""

from __future__ import annotations

import pytest

from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.kernels import cpu_fused
from tests.helpers.engine_outputs import output_logprobs, seeded_prompts

GREEDY = {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
LENGTHS = (300, 37, 5, 1, 90)


def _runs() -> bool:
    ext = cpu_fused.load()
    return ext is not None and ext.quant_w16_prefill_isa() != ""


pytestmark = pytest.mark.skipif(not _runs(), reason="the bf16 dot products need AMX-bf16 or AVX-512 BF16")


@pytest.mark.parametrize("fmt,kv", [("int4wo-128", "auto"), ("int8wo", "auto"), ("int4wo-128", "fp8_e4m3")],
                         ids=["int4wo-128", "int8wo", "int4wo-128-fp8-kv"])
def test_fast_prefill_keeps_the_bits_with_bf16_dot_products(fmt, kv):
    from impl import Engine

    ps = seeded_prompts(LENGTHS)
    runs = {}
    for flag in (False, True):
        eng = Engine(tiny_checkpoint("e2b_bench_bf16"), dtype="bfloat16", torchao_config=fmt,
                     kv_cache_dtype=kv, kv_sharing_fast_prefill=flag, chunked_prefill_size=128, disable_radix_cache=True, random_seed=0)
        try:
            info = eng.get_server_info()["cpu_kernels"]
            assert "prefill in bf16 dot products" in info["linear"]["reason"], info
            batched = eng.generate(input_ids=ps, sampling_params=GREEDY, return_logprob=True)
            alone = [eng.generate(input_ids=[p], sampling_params=GREEDY, return_logprob=True)[0] for p in ps[:3]]
            eng.check_integrity()
        finally:
            eng.shutdown()
        runs[flag] = ([o["output_ids"] for o in batched], output_logprobs(batched), output_logprobs(alone))
    assert runs[False] == runs[True]
