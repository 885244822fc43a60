"""RMSNorm as Gemma-4 computes it: in float32, weight used as is (no ``1 + w``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from impl.kernels.functional import rms_norm

__all__ = ["RMSNorm", "rms_norm"]


class RMSNorm(nn.Module):
    """``x * (mean(x^2) + eps)^-0.5 * weight``; ``with_scale=False`` drops the weight (v_norm, router norm)."""

    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.with_scale = with_scale
        if with_scale:
            self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is x * (mean(x^2) + eps)^-0.5 [* w] in one call, bit-identical to the reference's
        # pow(., -0.5) form (torch evaluates pow(., -0.5) as rsqrt), without a Python hop per op.
        w = self.weight if self.with_scale else None
        if x.dtype == torch.float32 and (w is None or w.dtype == torch.float32):
            return rms_norm(x, w, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), None if w is None else w.float(), self.eps).to(x.dtype)
