"""fp8 KV pools: what set_kv_buffer stores (value / scale, saturated), the scales readers get, and the
--quantization-param-path file (SGLang's / vLLM's schema), its errors included."""

from __future__ import annotations

import json

import pytest
import torch

from impl.cache.kv_pool import TokenToKVPool
from impl.cache.kv_quant import KVScales, kv_cache_torch_dtype, load_kv_scales
from tests.helpers.model import ours


@pytest.mark.parametrize("name,fmt", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_pool_stores_scaled_saturated_values_at_half_the_bytes(name, fmt):
    cfg = ours("e2b").config
    assert kv_cache_torch_dtype(name, torch.float32) is fmt
    scales = KVScales({13: (0.5, 4.0)}, "test")
    pool = TokenToKVPool(cfg, capacity=8, dtype=fmt, scales=scales)
    bf16 = TokenToKVPool(cfg, capacity=8, dtype=torch.bfloat16)
    assert pool.bytes_per_token * 2 == bf16.bytes_per_token
    heads, d = cfg.layer_num_kv_heads[13], cfg.layer_head_dims[13]
    k = torch.randn(2, heads, d)
    k[0, 0, 0] = 1e9  # past the format's range: stored as its largest finite value, never inf / NaN
    v = torch.randn(2, heads, d)
    pool.set_kv_buffer(13, torch.tensor([3, 6]), k, v)
    kb, vb = pool.get_kv_buffer(13)
    assert kb.dtype is fmt and pool.get_kv_scales(13) == (0.5, 4.0) and pool.get_kv_scales(0) == (1.0, 1.0)
    assert float(kb[3, 0, 0].float()) == torch.finfo(fmt).max
    torch.testing.assert_close(kb[6].float(), (k[1] / 0.5).to(fmt).float(), rtol=0, atol=0)
    torch.testing.assert_close(vb[3].float() * 4.0, v[0], rtol=0.13, atol=0.02)  # fp8 rounding
    assert bool(torch.isfinite(kb.float()).all()) and kb[0].float().abs().sum() == 0
    assert TokenToKVPool(cfg, 8, torch.bfloat16, scales=scales).get_kv_scales(13) == (1.0, 1.0)  # not fp8


def _write(tmp_path, body) -> str:
    path = tmp_path / "kv_scales.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


def _file(layers, dtype="float8_e4m3fn", **extra):
    return {"model_type": "gemma4_text", "kv_cache": {"dtype": dtype, "scaling_factor": {"0": layers}}, **extra}


def test_scale_file_gives_every_kv_layer_its_scale(tmp_path):
    # 35 layers: 0..14 own KV; entries for the KV-shared layers 15..34 are accepted and unused
    layers = {str(i): 0.25 * (1 + i % 3) for i in range(35)}
    s = load_kv_scales(_write(tmp_path, _file(layers)), "fp8_e4m3", "gemma4_text", 35, tuple(range(15)))
    assert s.get(4) == (0.5, 0.5) and s.get(14) == (0.75, 0.75) and set(s.per_layer) == set(range(15))
    assert "0.25..0.75 over 15 layers" in s.describe() and "kv_scales.json" in s.describe()
    assert load_kv_scales(None, "fp8_e4m3", "gemma4_text", 35, tuple(range(15))).get(3) == (1.0, 1.0)


@pytest.mark.parametrize("body,kv_dtype,match", [
    (_file({str(i): 1.0 for i in range(14)}), "fp8_e4m3", r"no scale for KV-owning layer\(s\) \[14\]"),
    (_file({str(i): 1.0 for i in range(15)}), "fp8_e5m2", "kv_cache.dtype is 'float8_e4m3fn'.*needs 'float8_e5m2'"),
    (_file({**{str(i): 1.0 for i in range(15)}, "3": -2.0}), "fp8_e4m3", "the scale of layer 3 is -2.0"),
    (_file({**{str(i): 1.0 for i in range(15)}, "40": 1.0}), "fp8_e4m3", "layer 40 is outside"),
    (_file({"x": 1.0}), "fp8_e4m3", "layer key 'x' is not an integer"),
    ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {}, "1": {}}}}, "fp8_e4m3", 'rank "0"'),
    (_file({str(i): 1.0 for i in range(15)}, model_type="llama"), "fp8_e4m3", "model_type is 'llama'"),
    ("{not json", "fp8_e4m3", "not JSON"),
    ({"scales": []}, "fp8_e4m3", "no kv_cache object"),
    (_file({str(i): 1.0 for i in range(15)}), "bf16", "needs --kv-cache-dtype fp8_e4m3|but --kv-cache-dtype is bf16"),
])
def test_bad_scale_files_are_refused_naming_the_flag(tmp_path, body, kv_dtype, match):
    with pytest.raises(ValueError, match=match) as e:
        load_kv_scales(_write(tmp_path, body), kv_dtype, "gemma4_text", 35, tuple(range(15)))
    assert "--quantization-param-path" in str(e.value)


def test_missing_scale_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read it"):
        load_kv_scales(str(tmp_path / "nope.json"), "fp8_e4m3", "gemma4_text", 35, tuple(range(15)))
