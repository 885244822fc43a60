"""Feed-forward blocks: the dense gelu-tanh MLP and the MoE branch (router + experts)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from impl.kernels.functional import GELU_TANH
from impl.model.norm import RMSNorm


def _act(name: str):
    if name in GELU_TANH:
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "silu":
        return F.silu
    raise ValueError(f"hidden_activation {name!r} is not supported; Gemma-4 uses 'gelu_pytorch_tanh'.")


def _linear(i: int, o: int, dtype: torch.dtype) -> nn.Linear:
    lin = nn.Linear(i, o, bias=False, dtype=dtype)
    lin.weight.requires_grad_(False)
    return lin


class GemmaMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; KV-shared layers are double-wide when use_double_wide_mlp. (The CPU
    transform, ``impl/kernels/cpu_fused/transform.py``, runs gate and up as one stacked matmul.)"""

    def __init__(self, hidden: int, intermediate: int, activation: str, dtype: torch.dtype):
        super().__init__()
        self.gate_proj = _linear(hidden, intermediate, dtype)
        self.up_proj = _linear(hidden, intermediate, dtype)
        self.down_proj = _linear(intermediate, hidden, dtype)
        self.act = _act(activation)
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, hidden]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MoERouter(nn.Module):
    """Scale-free RMSNorm -> ``* scale * hidden^-0.5`` -> proj -> softmax (fp32) -> top-k, renormalised, per-expert scale."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.norm = RMSNorm(hidden, eps, with_scale=False)
        self.proj = _linear(hidden, num_experts, dtype)
        self.scale = nn.Parameter(torch.ones(hidden, dtype=dtype), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts, dtype=dtype), requires_grad=False)
        self.top_k = top_k
        self.root = hidden**-0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(x) * self.scale * self.root
        probs = torch.softmax(self.proj(h), dim=-1, dtype=torch.float32)  # [T, E]
        w, idx = torch.topk(probs, k=self.top_k, dim=-1)  # [T, K]
        w = w / w.sum(dim=-1, keepdim=True)
        return w * self.per_expert_scale[idx], idx


class MoEExperts(nn.Module):
    """gate_up_proj [E, 2 * I, hidden] (gate half first), down_proj [E, hidden, I]."""

    def __init__(self, num_experts: int, hidden: int, inter: int, activation: str, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter, dtype=dtype), requires_grad=False)
        self.act = _act(activation)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden]; weights/idx: [T, K]. Loop over experts that were hit (a per-expert grouped GEMM).
        out = torch.zeros_like(x)
        for e in torch.unique(idx).tolist():
            tok, slot = torch.where(idx == e)
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act(gate) * up, self.down_proj[e]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out
