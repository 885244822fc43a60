"""Row-wise torch functions shared by the model (``impl/model``) and the CPU fast paths
(``impl/kernels/cpu_fused``): one definition, so both round identically."""

from __future__ import annotations

import torch
from torch.nn import functional as F

# hidden_activation names of the tanh-approximated GELU (Gemma-4's; the fused CPU kernels compute this one)
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")

# The op F.rms_norm dispatches to, called directly on float32 (skips the Python wrapper and the
# composite's dtype bookkeeping: about 3 us of 12 per call on a decode batch).
_FUSED = getattr(torch.ops.aten, "_fused_rms_norm", None)


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x * (mean(x^2) + eps)^-0.5 [* w]`` over the last dim; float32 ``x`` and ``w`` (or None)."""
    if _FUSED is not None:
        return _FUSED(x, [x.shape[-1]], w, eps)[0]
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def apply_rope_prepared(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin_signed [T, 1, D] from ``rope.prepare_rope``. Equals ``rope.apply_rope`` bit for
    bit: ``(-x2) * s == x2 * (-s)`` exactly, so the sign moves from x to the table."""
    d = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., d:], x[..., :d]], dim=-1) * sin_signed
