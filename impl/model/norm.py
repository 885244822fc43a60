"""RMSNorm as Gemma-4 computes it: in float32, weight used as is (no ``1 + w``)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``x * (mean(x^2) + eps)^-0.5 * weight``; ``with_scale=False`` drops the weight (v_norm, router norm)."""

    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.with_scale = with_scale
        if with_scale:
            self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        # pow(., -0.5) rather than rsqrt: the reference does the same, so fp32 results agree bit-for-bit more often.
        out = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.with_scale:
            out = out * self.weight.float()
        return out.to(x.dtype)
