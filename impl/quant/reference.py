"""The torch definition of every quantized format (``base.py``): what the fused CPU kernels must compute.

``linear(x, w, k)`` is x @ dequant(w)^T in float32 for the weight-only kinds; for W8A8 the activations are
quantized per row as ``quantize_rows`` says and the dot products are exact integers, scaled as
``(float(acc) * s_w) * s_x`` (the kernel's order: W8A8 results match it bit for bit); for W4A8 per row and
group (``quantize_groups``), each group's integer dot product corrected by its zero point and scaled, the
groups summed (in float64 here: the kernel's float order differs in the last bits).
"""

from __future__ import annotations

import torch

from impl.quant.base import format_of


def _floats(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4 c] -> float32 [..., c]."""
    return b.contiguous().view(torch.float32)


def dequantize(w: torch.Tensor, k: int) -> torch.Tensor:
    """Packed ``w`` [N, G, B] -> float32 [N, K]."""
    fmt = format_of(w, k)
    if fmt is None:
        return w.float()
    n, groups, _ = w.shape
    g = k // groups
    b = w.view(torch.uint8)
    if fmt.bits == 8:
        q = b[..., :g].view(torch.int8).float()
        s = _floats(b[..., g : g + 4])
        return (q * s).reshape(n, k)
    half = g // 2
    nib = b[..., :half]
    q = torch.cat([nib & 15, nib >> 4], dim=2).float()  # [N, G, g]
    s = _floats(b[..., half : half + 4])
    z = _floats(b[..., half + 4 : half + 8])
    return ((q - z) * s).reshape(n, k)


# Asymmetric int4's range search (pack.py): each group quantizes over [lo * a, hi * b], a and b from these scales.
INT4_RANGE_SCALES = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def int4_range_choices(wg: torch.Tensor) -> torch.Tensor:
    """For float32 groups ``wg`` [n, G, g]: the index ``ia * 6 + ib`` (int64 [n, G]) of the range [lo * a, hi * b]
    (lo = min(w, 0), hi = max(w, 0); a, b = INT4_RANGE_SCALES[ia], [ib]) whose codes, made as ``pack.py`` makes
    them, dequantize nearest to the group in squared error (float32); the first in (ia, ib) order on a tie.
    The compiled kernel (cpu_fused ``int4_range_choices``) sums each error in another order."""
    lo = wg.amin(dim=2, keepdim=True).clamp(max=0.0)
    hi = wg.amax(dim=2, keepdim=True).clamp(min=0.0)
    scales = torch.tensor(INT4_RANGE_SCALES, dtype=torch.float32)
    errs = []
    for a in scales:
        for b in scales:
            lo_c, hi_c = lo * a, hi * b
            s = (hi_c - lo_c) / 15.0
            safe = torch.where(s > 0, s, 1.0)
            z = torch.round(-lo_c / safe).clamp_(0, 15)
            q = (torch.round(wg / safe) + z).clamp_(0, 15)
            errs.append(((s * (q - z) - wg) ** 2).sum(dim=2))
    return torch.stack(errs, dim=-1).argmin(dim=-1)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's activations: x [M, K] -> (int8 codes [M, K], float32 scales [M]): s = max|x| / 127, q = round(x / s)."""
    xf = x.float()
    s = xf.abs().amax(dim=1) / 127.0
    safe = torch.where(s > 0, s, 1.0)[:, None]
    q = torch.where(s[:, None] > 0, torch.round(xf / safe), 0.0).clamp_(-127, 127).to(torch.int8)
    return q, s


def quantize_groups(x: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W4A8's activations: x [M, K] -> (int8 codes [M, K], float32 scales [M, G], int32 code sums [M, G]), per row
    and group of ``g`` inputs as ``quantize_rows`` does per row."""
    m, k = x.shape
    q, s = quantize_rows(x.float().reshape(m * (k // g), g))
    q = q.reshape(m, k)
    return q, s.reshape(m, k // g), q.reshape(m, k // g, g).sum(dim=2, dtype=torch.int32)


def _w4a8(x: torch.Tensor, w: torch.Tensor, g: int) -> torch.Tensor:
    """sum over groups of (sum q xq - z sum xq) * (s * s_x) (the kernel sums in another float order)."""
    n, groups, _ = w.shape
    b = w.view(torch.uint8)
    half = g // 2
    nib = b[..., :half]
    codes = torch.cat([nib & 15, nib >> 4], dim=2).double()  # [N, G, g]
    s = _floats(b[..., half : half + 4]).reshape(n, groups).double()
    z = _floats(b[..., half + 4 : half + 8]).reshape(n, groups).double()
    xq, xs, xsum = quantize_groups(x, g)
    xg = xq.double().reshape(-1, groups, g)  # [M, G, g]
    dots = torch.einsum("mgk,ngk->mng", xg, codes)  # exact integers
    val = (dots - z[None] * xsum.double()[:, None, :]) * (s[None] * xs.double()[:, None, :])
    return val.sum(dim=2).float()


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ dequant(w)^T -> float32 [M, N] (any weight: a float one is a plain matmul in float32)."""
    k = x.shape[-1]
    fmt = format_of(w, k)
    if fmt is None:
        return x.float() @ w.float().t()
    if fmt.kind == "w4a8":
        return _w4a8(x, w, fmt.group_size)
    if fmt.kind != "w8a8":
        return x.float() @ dequantize(w, k).t()
    xq, xs = quantize_rows(x)
    b = w.view(torch.uint8)
    wq = b[:, 0, :k].view(torch.int8)
    ws = _floats(b[:, 0, k : k + 4]).reshape(-1)
    acc = xq.double() @ wq.double().t()  # exact: |acc| < 2^53
    return (acc.float() * ws) * xs[:, None]
