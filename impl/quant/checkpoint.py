"""Pre-quantized checkpoints in the compressed-tensors format (as llm-compressor writes them).

Served: ``int-quantized`` / ``naive-quantized`` W8A8 (int8 weights per channel, symmetric; int8 activations per
token, dynamic) and ``pack-quantized`` W4A16 (int4 weights per group, symmetric, no activation
quantization). One config group targeting ``Linear``; modules in ``ignore`` keep their float weights.

Tensors per quantized linear ``X``: W8A8 ``X.weight`` (int8 [N, K]) and ``X.weight_scale`` ([N, 1]);
W4A16 ``X.weight_packed`` (int32 [N, K / 8]: code i of a word in bits 4i..4i+3, stored as q + 8),
``X.weight_scale`` ([N, K / group]) and ``X.weight_shape`` ([2]). ``Assembler`` collects them while the
loader reads the files and hands each finished weight over in the packed layout of ``base.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from impl.quant.base import INT4_GROUPS, WeightFormat
from impl.quant.pack import from_codes

SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "input_scale", "input_zero_point")


def _refuse(why: str) -> ValueError:
    return ValueError(f"the checkpoint's quantization_config is not servable here: {why}. Served: compressed-tensors W8A8 "
                      "int8 (channel weights, dynamic per-token activations) and W4A16 pack-quantized (symmetric int4, "
                      f"groups of {', '.join(map(str, INT4_GROUPS))}).")


def checkpoint_format(qc: Mapping[str, Any]) -> tuple[WeightFormat, str]:
    """(the format, the method's name) of a ``quantization_config``; ValueError for what is not served."""
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise _refuse(f"quant_method {method!r} (only compressed-tensors is read)")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise _refuse(f"{len(groups) if isinstance(groups, Mapping) else 0} config groups (one is served)")
    (group,) = groups.values()
    w = group.get("weights") or {}
    a = group.get("input_activations")
    fmt_name = group.get("format") or qc.get("format")
    if w.get("type", "int") != "int" or not w.get("symmetric", True):
        raise _refuse(f"weights of type {w.get('type')!r}, symmetric={w.get('symmetric')!r} (symmetric int only)")
    bits = w.get("num_bits")
    if bits == 8:
        if w.get("strategy") != "channel":
            raise _refuse(f"int8 weights with strategy {w.get('strategy')!r} (channel is served)")
        if not a or a.get("num_bits") != 8 or a.get("strategy") != "token" or not a.get("dynamic") \
                or not a.get("symmetric", True):
            raise _refuse("int8 weights without dynamic symmetric per-token int8 activations")
        return WeightFormat("w8a8"), f"compressed-tensors {fmt_name or 'int-quantized'} W8A8"
    if bits == 4:
        if a:
            raise _refuse("int4 weights with quantized activations")
        if w.get("strategy") != "group" or w.get("group_size") not in INT4_GROUPS:
            raise _refuse(f"int4 weights with strategy {w.get('strategy')!r}, group_size {w.get('group_size')!r}")
        if fmt_name != "pack-quantized":
            raise _refuse(f"int4 weights in format {fmt_name!r} (pack-quantized is served)")
        return WeightFormat("w4a16", int(w["group_size"])), f"compressed-tensors pack-quantized W4A16 g{w['group_size']}"
    raise _refuse(f"{bits}-bit weights")


def ignored(qc: Mapping[str, Any], module: str) -> bool:
    """True when the checkpoint keeps ``module`` (our parameter path without ``.weight``) in float."""
    for pat in qc.get("ignore") or ():
        if pat.startswith("re:"):
            if re.search(pat[3:], module):
                return True
        elif module == pat or module.endswith("." + pat) or pat.endswith("." + module) or pat.endswith(module):
            return True
    return False


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [N, K / 8] -> uint8 codes [N, K] (0..15)."""
    p = packed.to(torch.int32)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    codes = (p.unsqueeze(-1) >> shifts) & 15  # [N, K / 8, 8]
    return codes.reshape(p.shape[0], -1)[:, :k].to(torch.uint8)


@dataclass
class Assembler:
    """Collects the compressed-tensors parts of each quantized linear while the loader reads them."""

    fmt: WeightFormat
    parts: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def offer(self, module: str, suffix: str, t: torch.Tensor) -> None:
        if suffix in ("input_scale", "input_zero_point"):
            raise _refuse(f"{module}.{suffix}: static activation scales")
        self.parts.setdefault(module, {})[suffix] = t

    def ready(self, module: str) -> bool:
        p = self.parts.get(module, {})
        need = ("weight", "weight_scale") if self.fmt.kind == "w8a8" else ("weight_packed", "weight_scale", "weight_shape")
        return all(n in p for n in need)

    def build(self, module: str, n: int, k: int) -> torch.Tensor:
        """The packed weight of ``module`` ([n, k] in the model), its parts released."""
        p = self.parts.pop(module)
        if self.fmt.kind == "w8a8":
            codes = p["weight"]
            if codes.dtype != torch.int8 or tuple(codes.shape) != (n, k):
                raise ValueError(f"{module}.weight: expected int8 [{n}, {k}], got {codes.dtype} {tuple(codes.shape)}")
            scales = p["weight_scale"].reshape(n, 1)
            return from_codes(codes, scales, p.get("weight_zero_point"), self.fmt)
        shape = tuple(int(v) for v in p["weight_shape"].reshape(-1).tolist())
        if shape != (n, k):
            raise ValueError(f"{module}.weight_shape is {shape}, the model expects ({n}, {k})")
        if "weight_zero_point" in p and bool((p["weight_zero_point"] != 0).any()):
            raise _refuse(f"{module}: asymmetric int4 (zero points)")
        codes = unpack_int4(p["weight_packed"], k)  # q + 8
        scales = p["weight_scale"].reshape(n, k // self.fmt.group_size)
        return from_codes(codes, scales, torch.full_like(scales, 8.0, dtype=torch.float32), self.fmt)

    def leftover(self) -> list[str]:
        return sorted(self.parts)
