"""Gemma-4 self-attention on a packed batch: q/k/v projections and norms, RoPE, then the backend."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from impl.attention.base import AttentionLayer
from impl.model.norm import RMSNorm, rms_norm
from impl.model.rope import apply_rope_prepared
from impl.forward_batch import ForwardBatch


class Gemma4Attention(nn.Module):
    """One layer's attention. A KV-shared layer owns only q_proj/q_norm/o_proj and passes k=v=None.

    With ``attention_k_eq_v`` a full layer has no v_proj: V is the k_proj output
    before k_norm and RoPE (v_norm still applies).

    ``fuse_weights()`` (called once after loading) stacks q/k/v projections into one
    ``[(H + 2 Hkv) * D, hidden]`` weight (the original parameters become views of it)
    and the three head norms into one ``[H + 2 Hkv, D]`` scale table, so a layer runs
    one matmul, one norm and one RoPE for q, k and v together. Each output element is
    computed exactly as by the separate ops.
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
        self._qkv_w: torch.Tensor | None = None  # fused [(H + 2 Hkv) * D, hidden] (owning layers)
        self._norm_w: torch.Tensor | None = None  # [H + 2 Hkv, D] (owning) or [D] (shared)

    @torch.no_grad()
    def fuse_weights(self) -> None:
        """Stack the projections / norm scales once the weights are loaded (float32 only)."""
        q_ok, qw = self.q_norm.fast_weight()
        if self.q_proj.weight.dtype != torch.float32 or not q_ok or qw is None:
            return
        h, hkv, d = self.layer.num_heads, self.layer.num_kv_heads, self.layer.head_dim
        if not self.owns_kv:
            self._norm_w = qw
            return
        k_ok, kw = self.k_norm.fast_weight()
        if not k_ok or kw is None:
            return
        parts = [self.q_proj, self.k_proj, self.k_proj if self.v_proj is None else self.v_proj]
        fused = torch.cat([p.weight for p in parts], dim=0)  # [(H + 2 Hkv) * D, hidden]
        # The original parameters become views of the fused weight (no second copy; later in-place
        # loads still reach the fused weight). With k_eq_v the V rows repeat k_proj's.
        self.q_proj.weight = nn.Parameter(fused[: h * d], requires_grad=False)
        self.k_proj.weight = nn.Parameter(fused[h * d : (h + hkv) * d], requires_grad=False)
        if self.v_proj is not None:
            self.v_proj.weight = nn.Parameter(fused[(h + hkv) * d :], requires_grad=False)
        self._qkv_w = fused
        ones = torch.ones(hkv, d, dtype=qw.dtype, device=qw.device)  # v_norm has no scale
        self._norm_w = torch.cat([qw.expand(h, d), kw.expand(hkv, d), ones], dim=0)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        # x: [n, hidden]; cos/sin: [n, 1, head_dim] from rope.prepare_rope (sin's first half negated)
        layer = self.layer
        n, d, h = x.shape[0], layer.head_dim, layer.num_heads
        if self._norm_w is not None:
            k = v = None
            if self._qkv_w is not None:
                qkv = F.linear(x, self._qkv_w).view(n, -1, d)  # [n, H + 2 Hkv, D]
                qkv = rms_norm(qkv, None, self.eps).mul_(self._norm_w)
                hk = h + layer.num_kv_heads
                qk = apply_rope_prepared(qkv[:, :hk], cos, sin)  # [n, H + Hkv, D]
                q = qk[:, :h]
                k = qk[:, h:].reshape(n, -1)
                v = qkv[:, hk:].reshape(n, -1)
            else:
                q = apply_rope_prepared(rms_norm(F.linear(x, self.q_proj.weight).view(n, h, d), self._norm_w, self.eps), cos, sin)
            out = fb.attn_backend.forward(q.reshape(n, -1), k, v, layer, fb)  # [n, H * D]
            return F.linear(out, self.o_proj.weight)
        q = apply_rope_prepared(self.q_norm(self.q_proj(x).view(n, -1, d)), cos, sin)  # [n, H, D]
        k = v = None
        if self.owns_kv:
            k_raw = self.k_proj(x).view(n, -1, d)  # [n, Hkv, D]
            v_raw = self.v_proj(x).view(n, -1, d) if self.v_proj is not None else k_raw
            k = apply_rope_prepared(self.k_norm(k_raw), cos, sin).reshape(n, -1)
            v = self.v_norm(v_raw).reshape(n, -1)
        out = fb.attn_backend.forward(q.reshape(n, -1), k, v, self.layer, fb)  # [n, H * D]
        return self.o_proj(out)
