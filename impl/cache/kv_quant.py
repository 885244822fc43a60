"""KV-cache dtypes: which torch dtype a ``--kv-cache-dtype`` stores, fp8 writes, and per-layer KV scales.

fp8 pools (``fp8_e4m3`` -> ``torch.float8_e4m3fn``, ``fp8_e5m2`` -> ``torch.float8_e5m2``) store
``value / scale`` with a per-layer K scale and V scale, saturated to the format's finite range (a value
past it becomes the largest finite one, never inf or NaN). Every attention path dequantises in the
kernel: it reads the fp8 element as float32 and multiplies by the scale (``impl/kernels``).

Scales are 1.0 unless ``--quantization-param-path`` names a scale file (SGLang's flag; the JSON schema
SGLang and vLLM read)::

    {"model_type": "gemma4",
     "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.0123, "1": 0.0456, ...}}}}

``scaling_factor`` maps the tensor-parallel rank (this engine runs one: rank 0) to layer index -> one
scale used for K and V. Every KV-owning layer must have one; entries of KV-shared layers are accepted
and unused (those layers read their producer's cache). A file that does not fit is a ValueError at
startup naming the flag and what is wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

FP8_KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
BF16_KV_CACHE_DTYPES = ("bf16", "bfloat16")
SCALE_FLAG = "--quantization-param-path"
# the scale file's kv_cache.dtype names (torch's) for each --kv-cache-dtype
_FILE_DTYPE = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the pool stores for ``--kv-cache-dtype`` (``auto``: the model's)."""
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        return FP8_KV_CACHE_DTYPES[kv_cache_dtype]
    if kv_cache_dtype in BF16_KV_CACHE_DTYPES:
        return torch.bfloat16
    if kv_cache_dtype == "auto":
        return model_dtype
    raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} has no pool here (impl.args.unsupported refuses it at launch)")


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` in ``dtype``, saturated to its finite range (torch turns e5m2 overflow into inf)."""
    top = torch.finfo(dtype).max
    y = x.float()
    if scale != 1.0:
        y = y / scale
    return y.clamp_(-top, top).to(dtype)


@dataclass(frozen=True)
class KVScales:
    """Per KV-owning layer (k_scale, v_scale); layers not listed read 1.0."""

    per_layer: dict[int, tuple[float, float]] = field(default_factory=dict)
    source: str = "1.0 for every layer"

    def get(self, layer_id: int) -> tuple[float, float]:
        return self.per_layer.get(layer_id, (1.0, 1.0))

    def describe(self) -> str:
        if not self.per_layer:
            return f"KV scales {self.source}"
        vals = sorted({s for pair in self.per_layer.values() for s in pair})
        span = f"{vals[0]:g}" if len(vals) == 1 else f"{vals[0]:g}..{vals[-1]:g}"
        return f"KV scales {span} over {len(self.per_layer)} layers ({self.source})"


def _bad(path: str, what: str) -> ValueError:
    return ValueError(f"{SCALE_FLAG} {path}: {what}. Expected SGLang's / vLLM's KV-scale JSON: "
                      '{"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"<layer>": <scale>, ...}}}}.')


def load_kv_scales(path: str | None, kv_cache_dtype: str, model_type: str, num_hidden_layers: int,
                   kv_layer_ids: tuple[int, ...]) -> KVScales:
    """The scales for the pool: 1.0 without a file; otherwise the file's, validated (ValueError)."""
    if path is None:
        return KVScales()
    if kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        raise ValueError(f"{SCALE_FLAG} sets fp8 KV-cache scales, but --kv-cache-dtype is {kv_cache_dtype}: "
                         "pass --kv-cache-dtype fp8_e4m3 (or fp8_e5m2), or drop the flag.")
    try:
        with open(path) as f:
            raw: Any = json.load(f)
    except OSError as e:
        raise ValueError(f"{SCALE_FLAG} {path}: cannot read it ({e.strerror or e}).") from None
    except json.JSONDecodeError as e:
        raise _bad(path, f"not JSON ({e.msg} at line {e.lineno})") from None
    kv = raw.get("kv_cache") if isinstance(raw, dict) else None
    if not isinstance(kv, dict):
        raise _bad(path, "no kv_cache object")
    want = _FILE_DTYPE[kv_cache_dtype]
    if kv.get("dtype") != want:
        raise _bad(path, f"kv_cache.dtype is {kv.get('dtype')!r}, but --kv-cache-dtype {kv_cache_dtype} needs {want!r}")
    file_model = raw.get("model_type")
    if file_model is not None and not (file_model == model_type or {file_model, model_type} <= {"gemma4", "gemma4_text"}):
        raise _bad(path, f"model_type is {file_model!r}, this model is {model_type!r}")
    ranks = kv.get("scaling_factor")
    if not isinstance(ranks, dict) or set(ranks) != {"0"} or not isinstance(ranks["0"], dict):
        raise _bad(path, "kv_cache.scaling_factor must hold exactly tensor-parallel rank \"0\" (this engine runs tp 1)")
    scales: dict[int, tuple[float, float]] = {}
    for key, value in ranks["0"].items():
        try:
            layer = int(key)
        except (TypeError, ValueError):
            raise _bad(path, f"layer key {key!r} is not an integer") from None
        if not 0 <= layer < num_hidden_layers:
            raise _bad(path, f"layer {layer} is outside this model's layers 0..{num_hidden_layers - 1}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise _bad(path, f"the scale of layer {layer} is {value!r}; scales are positive finite numbers")
        if layer in kv_layer_ids:
            scales[layer] = (float(value), float(value))
    missing = [i for i in kv_layer_ids if i not in scales]
    if missing:
        raise _bad(path, f"no scale for KV-owning layer(s) {missing}")
    return KVScales(scales, f"from {path}")
