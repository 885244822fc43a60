"""fp8 KV through every attention path of the engine: torch_native's compiled rows kernel and its torch-ops
fallback, the triton backend's compiled CPU kernels and its torch reference.

Dequantising in the kernel with float32 accumulation means: the same as a float32 pool holding the
dequantised values. So each path with an fp8 pool (scales from a --quantization-param-path file) must give
what the same path gives with a float32 pool whose writes are rounded to fp8 and back: equal greedy tokens
and logprobs (measured: identical). Across paths only float32 summation order differs (4e-6 with a float32
pool), which an fp8 write can turn into a whole fp8 step where a value sits at a rounding boundary, so
paths are compared with each other on tokens only. The startup log names the pool's dtype and scales."""

from __future__ import annotations

import pytest

from contracts.kv_fp8 import write_scale_file
from impl import Engine
from impl.cache import kv_pool
from impl.cache.kv_quant import FP8_KV_CACHE_DTYPES
from impl.kernels import cpu_attn
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.engines import prompts

pytestmark = pytest.mark.skipif(cpu_attn.load() is None, reason="the compiled CPU attention kernels are unavailable")
SCALE = 0.5
PATHS = (("rows kernel", "torch_native"), ("torch ops", "torch_native"), ("cpu kernels", "triton"),
         ("torch reference", "triton"))


def _run(path: str, name: str, backend: str, monkeypatch, **args):
    monkeypatch.setenv("IMPL_TRITON_KERNELS", "reference" if name == "torch reference" else "auto")
    engine = Engine(path, attention_backend=backend, dtype="float32", disable_radix_cache=True, random_seed=0, **args)
    try:
        if name == "torch ops":
            engine.runner.prefill_backend._rows_kernel = False  # the fallback without a compiler
        sp = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
        out = engine.generate(input_ids=prompts(), sampling_params=[sp] * 6, return_logprob=True)
        engine.check_integrity()
        log = "\n".join(engine.startup_log)
        return [(o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]) for o in out], log
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.slow  # every attention path, Triton interpreter included
def test_every_attention_path_dequantises_the_fp8_pool_exactly(kv_dtype, monkeypatch, tmp_path):
    path = tiny_checkpoint("k_eq_v")  # 10 layers: sliding (2 KV heads) and full layers (1 KV head)
    fmt = FP8_KV_CACHE_DTYPES[kv_dtype]
    fp8_args = dict(kv_cache_dtype=kv_dtype, quantization_param_path=write_scale_file(str(tmp_path / "scales.json"), path, SCALE, kv_dtype))
    orig = kv_pool.TokenToKVPool.set_kv_buffer

    def rounded(self, layer, loc, k, v):  # a float32 pool holding what the fp8 pool dequantises to
        def q(x):
            return (x / SCALE).to(fmt).float() * SCALE
        return orig(self, layer, loc, q(k), q(v))

    tokens = {}
    for name, backend in PATHS:
        got, log = _run(path, name, backend, monkeypatch, **fp8_args)
        assert f"KV cache dtype: {str(fmt).replace('torch.', '')} (KV scales {SCALE:g} over 6 layers" in log
        monkeypatch.setattr(kv_pool.TokenToKVPool, "set_kv_buffer", rounded)
        want, _ = _run(path, name, backend, monkeypatch)
        monkeypatch.setattr(kv_pool.TokenToKVPool, "set_kv_buffer", orig)
        for (ids_a, lp_a), (ids_b, lp_b) in zip(want, got):
            assert ids_a == ids_b, f"{name}: greedy tokens differ from the float32 pool of fp8-rounded values"
            assert max(abs(a - b) for a, b in zip(lp_a, lp_b)) <= 1e-5, name
        tokens[name] = [ids for ids, _ in got]
    assert all(t == tokens["rows kernel"] for t in tokens.values()), "attention paths disagree on greedy tokens"


def test_fp8_pool_dtype_is_in_server_info():
    path = tiny_checkpoint("k_eq_v")
    engine = Engine(path, kv_cache_dtype="fp8_e5m2", max_total_tokens=64)
    try:
        info = engine.get_server_info()
        assert info["kv_cache_storage"].startswith("float8_e5m2 (KV scales 1.0 for every layer")
        mc = engine.model_config  # one byte per element, K and V, the 6 KV-owning layers
        assert info["kv_bytes_per_token"] == sum(2 * h * d for h, d in zip(mc.layer_num_kv_heads[:6], mc.layer_head_dims[:6]))
    finally:
        engine.shutdown()
