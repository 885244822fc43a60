"""Pure-torch references for the fused CPU kernels (the eager model path, op for op), in float32: bf16
weights and activations are widened first, so a bf16 kernel is checked against the float32 computation
on the same bf16 values."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from impl.kernels.functional import apply_rope_prepared, rms_norm


def _f32(t):
    return t.float() if isinstance(t, torch.Tensor) and t.dtype != torch.float32 else t


def attn_pre(h, w_in, proj_w, head_w, cos, sin_signed, q_heads: int, eps: float, onednn: bool = False):
    """See fused_layer.cpp ``attn_pre``. cos / sin_signed [n, D] or [n, 1, D]. Returns float32."""
    h, w_in, proj_w, head_w, cos, sin_signed = map(_f32, (h, w_in, proj_w, head_w, cos, sin_signed))
    n, (heads, d) = h.shape[0], head_w.shape
    kv = (heads - q_heads) // 2
    y = F.linear(rms_norm(h, w_in, eps), proj_w).view(n, heads, d)
    y = rms_norm(y, None, eps).mul_(head_w)
    c, s = cos.reshape(n, 1, d), sin_signed.reshape(n, 1, d)
    qk = apply_rope_prepared(y[:, : q_heads + kv], c, s)
    return qk[:, :q_heads].reshape(n, -1), qk[:, q_heads:].reshape(n, -1), y[:, q_heads + kv :].reshape(n, -1)


def decoder_post(h, attn_out, o_w, w_post_attn, w_pre_ff, gate_up, down_w, w_post_ff, ple, ple_gate_w, ple_proj_w,
                 w_ple_norm, scalar: float, eps: float, onednn: bool = False):
    """See fused_layer.cpp ``decoder_post``: ``gate_up`` is ``[gate_up_w]`` or ``[gate_w, up_w]`` (plain
    weights; ``onednn`` changes the library, not the math). Returns float32."""
    h, attn_out, o_w, w_post_attn, w_pre_ff, down_w, w_post_ff, ple, ple_gate_w, ple_proj_w, w_ple_norm = map(
        _f32, (h, attn_out, o_w, w_post_attn, w_pre_ff, down_w, w_post_ff, ple, ple_gate_w, ple_proj_w, w_ple_norm))
    inter = down_w.shape[1]
    gate_up_w = torch.cat([_f32(w) for w in gate_up], dim=0)
    h = h + rms_norm(F.linear(attn_out, o_w), w_post_attn, eps)
    gu = F.linear(rms_norm(h, w_pre_ff, eps), gate_up_w)
    m = F.linear(F.gelu(gu[:, :inter], approximate="tanh").mul_(gu[:, inter:]), down_w)
    h = h + rms_norm(m, w_post_ff, eps)
    if ple is not None:
        g = F.gelu(F.linear(h, ple_gate_w), approximate="tanh").mul_(ple)
        h = h + rms_norm(F.linear(g, ple_proj_w), w_ple_norm, eps)
    return h.mul_(scalar)
