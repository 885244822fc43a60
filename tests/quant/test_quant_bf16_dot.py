"""A bf16 model's W8A16 / W4A16 layers take bf16 dot products in prefill (quant_linear.h's bf16_dot, where the CPU
has AVX-512 BF16 without AMX): fast prefill keeps every greedy token and logprob bit for bit, because extend
batches pad their rows up to the kernel's first row count (``FusedLayerForward.min_rows``) and the kernel's rows do
not depend on the rows beside them. ``e2b_bench_bf16`` (hidden 256, intermediate 1024: every decoder weight at or
above the small-weight floor, as on E2B)."""

from __future__ import annotations

import pytest

from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.kernels import cpu_fused
from tests.helpers.engine_outputs import output_logprobs, seeded_prompts

GREEDY = {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
LENGTHS = (300, 37, 5, 1, 90)


def _runs() -> bool:
    ext = cpu_fused.load()
    return ext is not None and ext.quant_w16_prefill_isa() == "avx512_bf16"


pytestmark = pytest.mark.skipif(not _runs(), reason="the bf16 dot products need AVX-512 BF16 without AMX")


@pytest.mark.parametrize("fmt", ["int4wo-128", "int8wo"])
def test_fast_prefill_keeps_the_bits_with_bf16_dot_products(fmt):
    from impl import Engine

    ps = seeded_prompts(LENGTHS)
    runs = {}
    for flag in (False, True):
        eng = Engine(tiny_checkpoint("e2b_bench_bf16"), dtype="bfloat16", torchao_config=fmt,
                     kv_sharing_fast_prefill=flag, chunked_prefill_size=128, disable_radix_cache=True, random_seed=0)
        try:
            info = eng.get_server_info()["cpu_kernels"]
            assert "AVX-512 BF16 dot products" in info["linear"]["reason"], info
            batched = eng.generate(input_ids=ps, sampling_params=GREEDY, return_logprob=True)
            alone = [eng.generate(input_ids=[p], sampling_params=GREEDY, return_logprob=True)[0] for p in ps[:3]]
            eng.check_integrity()
        finally:
            eng.shutdown()
        runs[flag] = ([o["output_ids"] for o in batched], output_logprobs(batched), output_logprobs(alone))
    assert runs[False] == runs[True]
