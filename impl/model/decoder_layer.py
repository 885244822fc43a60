"""One Gemma-4 decoder layer: attention, dense MLP [+ MoE], PLE gate, layer_scalar."""

from __future__ import annotations

import torch
from torch import nn

from impl.attention.base import AttentionLayer
from impl.config.model_config import ModelConfig
from impl.forward_batch import ForwardBatch
from impl.model.attention import Gemma4Attention
from impl.model.mlp import GemmaMLP, MoEExperts, MoERouter, _act
from impl.model.norm import RMSNorm


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
        self.hidden_activation = c.hidden_activation
        # Faster CPU forwards are installed on a loaded model by impl/kernels/cpu_fused/transform.py.

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None, fb: ForwardBatch,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        # h: [n, hidden]; ple: [n, ple_dim] (this layer's slice) or None. rows [R] (fast prefill's last
        # self-decoder layer, yoco.attend): K/V of every row written, only those rows computed -> [R, hidden]
        residual = h if rows is None else h.index_select(0, rows)
        if rows is not None and ple is not None:
            ple = ple.index_select(0, rows)
        h = self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, fb, rows))
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
