"""Quantize float weights into the packed layout of ``base.py`` (torch, at load time).

A weight is processed ``ROW_CHUNK`` output rows at a time, so quantizing never holds a float32 copy of more
than one chunk (the LM head's 262,144 rows included). Rounding is ``torch.round`` (half to even).

Asymmetric int4 (``int4wo-<g>``, ``8da4w-<g>``) picks each group's range by search (``reference.int4_range_choices``:
the min / max range or one shrunk at either end, whichever dequantizes nearest), computed by the compiled kernel
where the extension is built and by the torch reference otherwise; ``IMPL_QUANT_INT4_SEARCH=0`` keeps min / max.
On the trained tiny checkpoint it moved greedy agreement with float32 to llama.cpp's Q4_0 (docs/quantization.md).
"""

from __future__ import annotations

import logging

import torch

from impl.envs import envs
from impl.quant.base import WeightFormat
from impl.quant.reference import INT4_RANGE_SCALES, int4_range_choices

logger = logging.getLogger("impl.quant")

ROW_CHUNK = 4096


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """float32 [..., c] -> uint8 [..., 4 c] (its bytes, little-endian as the kernels read them)."""
    return t.contiguous().view(torch.uint8)


def pack_rows(w: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``w`` [n, K] (any float dtype, n <= a chunk) -> packed [n, G, B]."""
    n, k = w.shape
    wf = w.float()
    if fmt.bits == 8:
        s = wf.abs().amax(dim=1, keepdim=True) / 127.0  # [n, 1]
        q = torch.where(s > 0, torch.round(wf / torch.where(s > 0, s, 1.0)), 0.0).clamp_(-127, 127).to(torch.int8)
        return torch.cat([q.view(torch.uint8), _as_bytes(s)], dim=1).view(fmt.torch_dtype).view(n, 1, k + 4)
    g = fmt.group_size
    groups = k // g
    wg = wf.view(n, groups, g)
    if fmt.symmetric:  # codes -8..7 stored as 0..15, z = 8 (compressed-tensors' symmetric int4: s = amax / 7.5)
        s = wg.abs().amax(dim=2, keepdim=True) / 7.5
        z = torch.full_like(s, 8.0)
        q = torch.round(wg / torch.where(s > 0, s, 1.0)).clamp_(-8, 7) + 8
    else:  # a range per group (min / max, or the search's choice), integer zero point in 0..15
        lo = wg.amin(dim=2, keepdim=True).clamp(max=0.0)
        hi = wg.amax(dim=2, keepdim=True).clamp(min=0.0)
        if envs.IMPL_QUANT_INT4_SEARCH.get():
            idx = range_choices(wg)
            scales = torch.tensor(INT4_RANGE_SCALES, dtype=torch.float32)
            n_s = len(INT4_RANGE_SCALES)
            lo = lo * scales[idx // n_s].unsqueeze(-1)
            hi = hi * scales[idx % n_s].unsqueeze(-1)
        s = (hi - lo) / 15.0
        z = torch.round(-lo / torch.where(s > 0, s, 1.0)).clamp_(0, 15)
        q = (torch.round(wg / torch.where(s > 0, s, 1.0)) + z).clamp_(0, 15)
    q = q.to(torch.uint8)
    half = g // 2
    nib = q[..., :half] | (q[..., half:] << 4)  # [n, G, g / 2]
    return torch.cat([nib, _as_bytes(s), _as_bytes(z)], dim=2).view(fmt.torch_dtype).contiguous()


def range_choices(wg: torch.Tensor) -> torch.Tensor:
    """``reference.int4_range_choices`` of float32 groups [n, G, g] (int64 [n, G]), by the compiled kernel where it
    is built and takes the group size, else by the reference (~25x slower)."""
    from impl.kernels import cpu_fused

    ext = cpu_fused.load()
    n, groups, g = wg.shape
    if ext is not None and g % 16 == 0:
        return ext.int4_range_choices(wg.reshape(n, groups * g).contiguous(), g).long()
    return int4_range_choices(wg)


def pack(w: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``w`` [N, K] -> packed [N, G, B], ``ROW_CHUNK`` rows at a time."""
    if w.dim() != 2 or not fmt.applies_to(w.shape[1]):
        raise ValueError(f"a weight of shape {tuple(w.shape)} cannot take {fmt.name()}")
    n, k = w.shape
    out = torch.empty(fmt.packed_shape(n, k), dtype=fmt.torch_dtype)
    for lo in range(0, n, ROW_CHUNK):
        out[lo : lo + ROW_CHUNK] = pack_rows(w[lo : lo + ROW_CHUNK], fmt)
    return out


def from_codes(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, fmt: WeightFormat) -> torch.Tensor:
    """Packed weight from a checkpoint's integer codes: ``codes`` [N, K] signed (int8 -128..127 / int4 -8..7,
    or unsigned 0..15 with ``zeros``), ``scales`` [N, G], ``zeros`` [N, G] or None (symmetric)."""
    n, k = codes.shape
    groups = fmt.groups(k)
    s = scales.float().reshape(n, groups, 1)
    if fmt.bits == 8:
        if zeros is not None and bool((zeros != 0).any()):
            raise ValueError("int8 weights with zero points are not supported (symmetric int8 only)")
        q = codes.to(torch.int8).view(torch.uint8).reshape(n, 1, k)
        return torch.cat([q, _as_bytes(s)], dim=2).view(fmt.torch_dtype).contiguous()
    g = k // groups
    if zeros is None:
        q = (codes.to(torch.int16) + 8).to(torch.uint8).view(n, groups, g)
        z = torch.full_like(s, 8.0)
    else:
        q = codes.to(torch.uint8).view(n, groups, g)
        z = zeros.float().reshape(n, groups, 1)
    half = g // 2
    nib = q[..., :half] | (q[..., half:] << 4)
    return torch.cat([nib, _as_bytes(s), _as_bytes(z)], dim=2).view(fmt.torch_dtype).contiguous()
