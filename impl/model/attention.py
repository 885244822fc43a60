"""Gemma-4 self-attention on a packed batch: q/k/v projections and norms, RoPE, then the backend."""

from __future__ import annotations

import torch
from torch import nn

from impl.attention.base import AttentionLayer
from impl.model import yoco
from impl.model.norm import RMSNorm
from impl.model.rope import apply_rope_prepared
from impl.forward_batch import ForwardBatch


class Gemma4Attention(nn.Module):
    """One layer's attention. A KV-shared layer owns only q_proj/q_norm/o_proj and passes k=v=None.

    With ``attention_k_eq_v`` a full layer has no v_proj: V is the k_proj output
    before k_norm and RoPE (v_norm still applies).

    This is the reference forward; faster CPU forwards (one stacked q/k/v matmul, fused kernels) are
    installed from outside by ``impl/kernels/cpu_fused/transform.py``, built from these parameters.
    """

    def __init__(self, layer: AttentionLayer, hidden: int, k_eq_v: bool, eps: float, dtype: torch.dtype):
        super().__init__()
        self.layer = layer
        h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        self.eps = eps
        self.owns_kv = not layer.is_kv_shared
        self.q_proj = nn.Linear(hidden, h * d, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(d, eps, dtype=dtype)
        if self.owns_kv:
            self.k_proj = nn.Linear(hidden, hkv * d, bias=False, dtype=dtype)
            self.v_proj = None if k_eq_v else nn.Linear(hidden, hkv * d, bias=False, dtype=dtype)
            self.k_norm = RMSNorm(d, eps, dtype=dtype)
            self.v_norm = RMSNorm(d, eps, with_scale=False)
        self.o_proj = nn.Linear(h * d, hidden, bias=False, dtype=dtype)
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        # x: [n, hidden]; cos/sin: [n, 1, head_dim] from rope.prepare_rope (sin's first half negated);
        # rows: fast prefill's selected rows (yoco.attend): every row's K/V written, [R, hidden] returned
        n, d = x.shape[0], self.layer.head_dim
        q = apply_rope_prepared(self.q_norm(self.q_proj(x).view(n, -1, d)), cos, sin)  # [n, H, D]
        k = v = None
        if self.owns_kv:
            k_raw = self.k_proj(x).view(n, -1, d)  # [n, Hkv, D]
            v_raw = self.v_proj(x).view(n, -1, d) if self.v_proj is not None else k_raw
            k = apply_rope_prepared(self.k_norm(k_raw), cos, sin).reshape(n, -1)
            v = self.v_norm(v_raw).reshape(n, -1)
        out = yoco.attend(q.reshape(n, -1), k, v, self.layer, fb, rows)  # [n or R, H * D]
        return self.o_proj(out)
