"""Which quantized format serves a model: from ``--quantization``, ``--torchao-config`` and the checkpoint.

Rules (each violation is a ValueError naming the flag and the fix, raised before any weight is read):

* a checkpoint whose config.json has a ``quantization_config`` is served in its own format; only the
  compressed-tensors formats below are known (``checkpoint.py``). ``--quantization`` may be left unset or
  name that method (``compressed-tensors``, or ``w8a8_int8`` for a W8A8 one); ``--torchao-config`` cannot
  re-quantize it;
* on a float checkpoint, ``--torchao-config`` quantizes while loading: ``int8dq`` (W8A8), ``int8wo``
  (W8A16), ``int4wo-<group>`` (W4A16, asymmetric, group 32/64/128/256), as SGLang's names say, and ``8da4w-<group>``
  (torchao's name for int8 dynamic activations with int4 weights: the same int4 codes as ``int4wo``, the
  activations quantized per row and group, W4A8);
  ``--quantization w8a8_int8`` is the same as ``int8dq``;
* ``--torchao-config-kv-shared`` (one of the same names) gives the KV-shared layers (the cross-decoder of a model
  with ``num_kv_shared_layers > 0``) their own format: only beside ``--torchao-config`` and only on a model that has
  such layers. With fast prefill those layers run on a few rows per prompt, so for them the bytes a decode step
  reads matter, not the matmul rate (e.g. ``--torchao-config int8dq --torchao-config-kv-shared 8da4w-128``);
* every other SGLang quantization method or torchao config is refused with the list of supported ones;
* quantized weights run on CPU (the fused kernels); CUDA is refused.

``IMPL_QUANT_LM_HEAD=0`` keeps the LM head in the float embedding's dtype (default: an int8 copy, W8A8 with the
activation-quantized formats W8A8 / W4A8, else W8A16).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from impl.envs import envs
from impl.quant.base import INT4_GROUPS, LM_HEAD_FORMAT, QuantScheme, WeightFormat

QUANTIZATION_SUPPORTED = ("w8a8_int8", "compressed-tensors")
# SGLang 0.5.23's other --quantization names: recognised, refused with the supported list
QUANTIZATION_KNOWN = (
    "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "petit_nvfp4", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8", "mxfp4", "mxfp8", "auto-round",
    "quark", "fbgemm_fp8", "blockwise_int8",
) + QUANTIZATION_SUPPORTED
TORCHAO_SUPPORTED = ("int8dq", "int8wo") + tuple(f"int4wo-{g}" for g in INT4_GROUPS) + tuple(f"8da4w-{g}" for g in INT4_GROUPS)


def _supported() -> str:
    return (f"--quantization {' or '.join(QUANTIZATION_SUPPORTED)} (a compressed-tensors checkpoint, or W8A8 while "
            f"loading a float one), --torchao-config {', '.join(TORCHAO_SUPPORTED)}")


def _torchao_format(value: str) -> WeightFormat:
    if value == "int8dq":
        return WeightFormat("w8a8")
    if value == "int8wo":
        return WeightFormat("w8a16")
    m = re.fullmatch(r"(int4wo|8da4w)-(\d+)", value)
    if m and int(m.group(2)) in INT4_GROUPS:
        return WeightFormat("w4a16" if m.group(1) == "int4wo" else "w4a8", int(m.group(2)), symmetric=False)
    raise ValueError(f"--torchao-config {value!r} is not supported here; supported: {', '.join(TORCHAO_SUPPORTED)} "
                     f"(int4wo and 8da4w take a group size of {', '.join(map(str, INT4_GROUPS))}). Unset it to serve the "
                     "checkpoint's own weights.")


def _lm_head(fmt: WeightFormat) -> WeightFormat | None:
    """The LM head's copy: int8 per channel; with activation-quantized decoder formats (W8A8, W4A8) its
    activations are quantized per row too (the W8A8 kernel reads the same bytes faster), else W8A16."""
    if not envs.IMPL_QUANT_LM_HEAD.get():
        return None
    return WeightFormat("w8a8") if fmt.kind in ("w8a8", "w4a8") else LM_HEAD_FORMAT


def resolve_scheme(quantization: str | None, torchao_config: str | None, quantization_config: Mapping[str, Any] | None,
                   device_type: str = "cpu", kv_shared_config: str | None = None,
                   num_kv_shared_layers: int | None = None) -> QuantScheme | None:
    """The scheme a model is served with (None: its float weights as they are). ``kv_shared_config``:
    ``--torchao-config-kv-shared``; ``num_kv_shared_layers``: the model's (None: not known here)."""
    from impl.quant.checkpoint import checkpoint_format

    torchao_config = (torchao_config or "").strip()
    kv_shared_config = (kv_shared_config or "").strip()
    kv_shared: WeightFormat | None = None
    if kv_shared_config:
        if not torchao_config:
            raise ValueError(f"--torchao-config-kv-shared {kv_shared_config} gives the KV-shared layers their own format "
                             "when --torchao-config quantizes a float checkpoint while loading; give --torchao-config "
                             "too (e.g. --torchao-config int8dq --torchao-config-kv-shared 8da4w-128), or unset it.")
        if num_kv_shared_layers is not None and num_kv_shared_layers <= 0:
            raise ValueError(f"--torchao-config-kv-shared {kv_shared_config} formats the KV-shared layers, but this model "
                             "has none (num_kv_shared_layers=0); unset it.")
        try:
            kv_shared = _torchao_format(kv_shared_config)
        except ValueError as e:
            raise ValueError(str(e).replace("--torchao-config", "--torchao-config-kv-shared", 1)) from None
    if quantization is not None and quantization not in QUANTIZATION_SUPPORTED:
        known = "a quantization method of SGLang's that this engine does not implement" if quantization in QUANTIZATION_KNOWN \
            else "not a known quantization method"
        raise ValueError(f"--quantization {quantization!r} is {known}; supported: {_supported()}.")
    if quantization is not None and torchao_config:
        raise ValueError(f"--quantization {quantization} and --torchao-config {torchao_config} both quantize the weights; "
                         "give one of them.")
    scheme: QuantScheme | None = None
    if quantization_config is not None:
        fmt, method = checkpoint_format(quantization_config)
        if torchao_config:
            raise ValueError(f"--torchao-config {torchao_config} cannot re-quantize a checkpoint that is already quantized "
                             f"({method}); unset it.")
        if quantization == "w8a8_int8" and fmt.kind != "w8a8":
            raise ValueError(f"--quantization w8a8_int8 names W8A8 int8, but the checkpoint holds {fmt.name()}; use "
                             "--quantization compressed-tensors or leave it unset.")
        scheme = QuantScheme(fmt, f"checkpoint ({method})", prequantized=True, lm_head=_lm_head(fmt))
    elif quantization == "compressed-tensors":
        raise ValueError("--quantization compressed-tensors needs a checkpoint whose config.json has a compressed-tensors "
                         "quantization_config; this one has none. To quantize a float checkpoint while loading use "
                         f"--torchao-config ({', '.join(TORCHAO_SUPPORTED)}) or --quantization w8a8_int8.")
    elif quantization == "w8a8_int8":
        w8a8 = WeightFormat("w8a8")
        scheme = QuantScheme(w8a8, "--quantization w8a8_int8", prequantized=False, lm_head=_lm_head(w8a8))
    elif torchao_config:
        fmt = _torchao_format(torchao_config)
        source = f"--torchao-config {torchao_config}" + (f" --torchao-config-kv-shared {kv_shared_config}" if kv_shared else "")
        scheme = QuantScheme(fmt, source, prequantized=False, lm_head=_lm_head(fmt),
                             kv_shared=kv_shared if kv_shared != fmt else None)
    if scheme is not None and device_type != "cpu":
        raise ValueError(f"quantized weights ({scheme.describe()}) run on CPU only here (the fused CPU kernels); use "
                         "--device cpu or serve the float checkpoint.")
    return scheme
