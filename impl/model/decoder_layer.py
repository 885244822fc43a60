"""One Gemma-4 decoder layer: attention, dense MLP [+ MoE], PLE gate, layer_scalar."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from impl.attention.base import AttentionLayer
from impl.kernels import cpu_fused
from impl.config.model_config import ModelConfig
from impl.model.attention import Gemma4Attention
from impl.model.mlp import GELU_TANH, GemmaMLP, MoEExperts, MoERouter, _act
from impl.model.norm import RMSNorm, rms_norm


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, layer: AttentionLayer, dtype: torch.dtype):
        # index: this layer's place in config.layer_types (== layer.layer_id except in the assistant)
        super().__init__()
        c, hid, eps = config, config.hidden_size, config.rms_norm_eps
        self.layer_id = layer.layer_id
        self.layer_type = c.layer_types[index]
        k_eq_v = c.attention_k_eq_v and not c.is_sliding(index)
        self.self_attn = Gemma4Attention(layer, hid, k_eq_v, eps, dtype)
        wide = c.use_double_wide_mlp and c.is_kv_shared(index)
        self.mlp = GemmaMLP(hid, c.intermediate_size * (2 if wide else 1), c.hidden_activation, dtype)
        self.input_layernorm = RMSNorm(hid, eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(hid, eps, dtype=dtype)
        self.pre_feedforward_layernorm = RMSNorm(hid, eps, dtype=dtype)
        self.post_feedforward_layernorm = RMSNorm(hid, eps, dtype=dtype)
        self.layer_scalar = nn.Parameter(torch.ones(1, dtype=dtype), requires_grad=False)  # stored as shape [1]
        self.ple_dim = c.hidden_size_per_layer_input
        if self.ple_dim:
            self.act = _act(c.hidden_activation)
            self.per_layer_input_gate = nn.Linear(hid, self.ple_dim, bias=False, dtype=dtype)
            self.per_layer_projection = nn.Linear(self.ple_dim, hid, bias=False, dtype=dtype)
            self.post_per_layer_input_norm = RMSNorm(hid, eps, dtype=dtype)
        self.enable_moe = c.enable_moe_block
        if self.enable_moe:
            self.router = MoERouter(hid, c.num_experts, c.top_k_experts, eps, dtype)
            self.experts = MoEExperts(c.num_experts, hid, c.moe_intermediate_size, c.hidden_activation, dtype)
            self.post_feedforward_layernorm_1 = RMSNorm(hid, eps, dtype=dtype)
            self.post_feedforward_layernorm_2 = RMSNorm(hid, eps, dtype=dtype)
            self.pre_feedforward_layernorm_2 = RMSNorm(hid, eps, dtype=dtype)
        for p in self.parameters():
            p.requires_grad_(False)
        self.eps = eps
        self._fast: tuple | None = None  # float32 norm weights and layer_scalar after fuse_weights()
        self._fused: tuple | None = None  # (extension, attn_pre args, decoder_post args) on CPU float32
        self.gelu_tanh = c.hidden_activation in GELU_TANH

    @torch.no_grad()
    def fuse_weights(self) -> None:
        """Once the weights are loaded: fused q/k/v and gate/up weights, and the per-layer constants
        the float32 fast path reads (norm weights, layer_scalar as a Python float: ``h * float``
        rounds exactly as ``h * tensor([s])``). Nothing changes numerically."""
        self.self_attn.fuse_weights()
        self.mlp.fuse_weights()
        norms = [self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm, self.post_feedforward_layernorm]
        if self.ple_dim:
            norms.append(self.post_per_layer_input_norm)
        fast = [n.fast_weight() for n in norms]
        if self.enable_moe or self.layer_scalar.dtype != torch.float32 or not all(ok for ok, _ in fast):
            return
        ws = [w for _, w in fast]
        scalar = float(self.layer_scalar.reshape(-1)[0])
        ple = (self.per_layer_input_gate.weight, self.per_layer_projection.weight, ws[4]) if self.ple_dim else None
        self._fast = (ws[0], ws[1], ws[2], ws[3], ple, scalar)
        self._fused = self._fused_kernel_args()

    def _fused_kernel_args(self) -> tuple | None:
        """Arguments of the fused CPU kernels (impl/kernels/cpu_fused) for this layer, or None when
        they do not apply (not CPU float32, not gelu-tanh, unfused weights, or no extension)."""
        att, mlp = self.self_attn, self.mlp
        proj = att._qkv_w if att.owns_kv else att.q_proj.weight
        if not self.gelu_tanh or att._norm_w is None or proj is None or mlp._gate_up_w is None:
            return None
        if not cpu_fused.usable_for(proj, mlp._gate_up_w) or (ext := cpu_fused.load()) is None:
            return None
        w_in, w_post_attn, w_pre_ff, w_post_ff, ple, scalar = self._fast
        lay = att.layer
        head_w = att._norm_w if att.owns_kv else att._norm_w.expand(lay.num_heads, lay.head_dim)
        pre = (w_in, proj, head_w.contiguous(), lay.num_heads, self.eps)
        ple_w = ple if ple is not None else (None, None, None)
        post = (att.o_proj.weight, w_post_attn, w_pre_ff, mlp._gate_up_w, mlp.down_proj.weight, w_post_ff, ple_w, scalar, self.eps)
        return ext, pre, post

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None, fb) -> torch.Tensor:
        # h: [n, hidden]; ple: [n, ple_dim] (this layer's slice) or None
        if self._fused is not None:
            return self._forward_fused(h, cos, sin, ple, fb)
        if self._fast is not None:
            return self._forward_fast(h, cos, sin, ple, fb)
        residual = h
        h = self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, fb))
        h = residual + h
        residual = h
        h = self.mlp(self.pre_feedforward_layernorm(h))
        if self.enable_moe:
            # The router and experts read the residual from before the MLP, not the MLP output.
            w, idx = self.router(residual)
            moe = self.post_feedforward_layernorm_2(self.experts(self.pre_feedforward_layernorm_2(residual), w, idx))
            h = self.post_feedforward_layernorm_1(h) + moe
        h = residual + self.post_feedforward_layernorm(h)
        if self.ple_dim:
            g = self.act(self.per_layer_input_gate(h)) * ple
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return h * self.layer_scalar

    def _forward_fused(self, h, cos, sin, ple, fb) -> torch.Tensor:
        """``_forward_fast`` as two fused CPU kernels around the attention backend (same math, float32
        rounding may differ in the last bit: see impl/kernels/cpu_fused)."""
        ext, (w_in, proj, head_w, q_heads, eps), post = self._fused
        q, k, v = ext.attn_pre(h, w_in, proj, head_w, cos, sin, q_heads, eps)
        if not self.self_attn.owns_kv:
            k = v = None
        out = fb.attn_backend.forward(q, k, v, self.self_attn.layer, fb)  # [n, H * D]
        o_w, w_post_attn, w_pre_ff, gate_up_w, down_w, w_post_ff, (g_w, p_w, n_w), scalar, eps = post
        return ext.decoder_post(
            h, out, o_w, w_post_attn, w_pre_ff, gate_up_w, down_w, w_post_ff,
            None if g_w is None else ple, g_w, p_w, n_w, scalar, eps,
        )

    def _forward_fast(self, h, cos, sin, ple, fb) -> torch.Tensor:
        """The same computation in float32 with plain function calls (no nn.Module dispatch per op):
        decode steps are bound by per-op overhead, not FLOPs."""
        w_in, w_post_attn, w_pre_ff, w_post_ff, ple_w, scalar = self._fast
        eps = self.eps
        a = self.self_attn.forward(rms_norm(h, w_in, eps), cos, sin, fb)
        h = h + rms_norm(a, w_post_attn, eps)
        m = self.mlp.forward(rms_norm(h, w_pre_ff, eps))
        h = h + rms_norm(m, w_post_ff, eps)
        if ple_w is not None:
            w_gate, w_proj, w_norm = ple_w
            g = self.act(F.linear(h, w_gate)).mul_(ple)
            h = h + rms_norm(F.linear(g, w_proj), w_norm, eps)
        return h.mul_(scalar)
