"""Gemma-4 text model on a packed token batch, split into self-decoder and cross-decoder.

Parameter names equal the checkpoint's with the leading ``model.`` removed
(``layers.3.self_attn.q_proj.weight``), so the loader maps names one to one.

Layers ``[0, first_kv_shared_layer)`` form the *self-decoder*: they write K/V.
The KV-shared layers after them form the *cross-decoder*: they only read K/V of
their producers. With YOCO fast prefill (``fb.fast_prefill``) the cross-decoder
runs only on the LM-head rows (see ``impl/model/yoco.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from impl.attention.base import AttentionLayer
from impl.config.model_config import ModelConfig
from impl.model import ple as ple_mod
from impl.model import yoco
from impl.model.decoder_layer import Gemma4DecoderLayer
from impl.model.norm import RMSNorm
from impl.model.outputs import LogitsOutput
from impl.model import rope as rope_mod
from impl.forward_batch import ForwardBatch


# vocabulary rows per block when the LM head weight is narrower than the hidden states (below)
LM_HEAD_BLOCK_ROWS = 16384


def lm_head_matmul(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h @ w.T`` as float32 [R, vocab]. A weight narrower than ``h`` (the bf16 tied table under --dtype
    float32) is widened one block of vocabulary rows at a time, so no widened copy of the table exists
    (E2B: 1.6 GB in float32) and each row's logits equal those of the widened weight."""
    if w.dtype == h.dtype:
        return F.linear(h, w).float()
    out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
    for first in range(0, w.shape[0], LM_HEAD_BLOCK_ROWS):
        blk = w[first : first + LM_HEAD_BLOCK_ROWS].to(h.dtype)
        out[:, first : first + blk.shape[0]] = F.linear(h, blk)
    return out


def build_attention_layers(config: ModelConfig) -> list[AttentionLayer]:
    """One AttentionLayer per decoder layer; a KV-shared layer reads its producer's K/V."""
    producers = config.kv_producer
    out = []
    for i in range(config.num_hidden_layers):
        kv_id = producers[i]
        if kv_id is None:
            raise ValueError(
                f"layer {i} ({config.layer_types[i]}) is KV-shared but no earlier non-shared layer has its type; "
                "the checkpoint's layer_types / num_kv_shared_layers are inconsistent."
            )
        sliding = config.is_sliding(i)
        out.append(
            AttentionLayer(
                layer_id=i,
                kv_layer_id=kv_id,
                num_heads=config.num_attention_heads,
                num_kv_heads=config.layer_num_kv_heads[kv_id],
                head_dim=config.layer_head_dims[i],
                scaling=1.0,  # Gemma-4 folds the 1/sqrt(d) into q_norm/k_norm
                sliding_window=config.sliding_window if sliding else None,
            )
        )
    return out


class Gemma4ForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        if not config.is_gemma4:
            raise ValueError(f"Gemma4ForCausalLM needs a gemma4 / gemma4_text config, got model_type {config.model_type!r}.")
        self.config = config
        self.dtype = dtype
        c = config
        with torch.device(device):
            self.attention_layers = build_attention_layers(c)
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, dtype=dtype)
            self.layers = nn.ModuleList(Gemma4DecoderLayer(c, i, al, dtype) for i, al in enumerate(self.attention_layers))
            self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=dtype)
            self.ple_dim = c.hidden_size_per_layer_input
            self.ple_fused = None  # ple.per_layer_inputs' one-pass kernel, where the CPU kernels install one
            if self.ple_dim:
                n = c.num_hidden_layers
                self.embed_tokens_per_layer = nn.Embedding(c.vocab_size_per_layer_input, n * self.ple_dim, dtype=dtype)
                self.per_layer_model_projection = nn.Linear(c.hidden_size, n * self.ple_dim, bias=False, dtype=dtype)
                self.per_layer_projection_norm = RMSNorm(self.ple_dim, c.rms_norm_eps, dtype=dtype)
            if not c.tie_word_embeddings:
                self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=dtype)
        for p in self.parameters():
            p.requires_grad_(False)
        self.first_kv_shared_layer = c.first_kv_shared_layer

    # ---- pieces -------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The table may be narrower than the model dtype (a bf16 table under --dtype float32, see
        # loader.WeightPlan): the gathered rows are widened exactly, then scaled in the model dtype. The
        # scale is rounded to that dtype first, as the reference does (sqrt(1536) in bf16 != in fp32).
        # A table mapped from the checkpoint (loader.WeightPlan) gathers through its FileRows (no pages of the
        # mapping made resident).
        file_rows = getattr(self.embed_tokens, "file_rows", None)
        rows = (file_rows(input_ids) if file_rows is not None else self.embed_tokens(input_ids)).to(self.dtype)
        return rows * torch.tensor(math.sqrt(self.config.hidden_size), dtype=self.dtype)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor | None:
        if not self.ple_dim:
            return None
        return ple_mod.per_layer_inputs(
            input_ids, embeds, self.embed_tokens_per_layer, self.per_layer_model_projection,
            self.per_layer_projection_norm, self.config.num_hidden_layers, self.ple_fused,
        )

    def rope_tables(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """layer type -> (cos, signed sin) [n, 1, head_dim of that type] (rope.prepare_rope) for these positions."""
        out = {}
        for i, t in enumerate(self.config.layer_types):
            if t not in out:
                inv = rope_mod.rope_inv_freq(self.config.rope[t], self.config.layer_head_dims[i])
                out[t] = rope_mod.prepare_rope(*rope_mod.rope_cos_sin(positions, inv, self.dtype))
        return out

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def project_to_vocab(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head's matmul: h [R, hidden] -> [R, vocab] (the CPU transform installs a faster one;
        ``lm_head_matmul`` widens a table narrower than ``h``)."""
        return lm_head_matmul(h, self.lm_head_weight())

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [R, hidden] (normed) -> [R, vocab] float32, final softcap applied. Only the rows that need
        logits reach here (``fb.logits_indices``; fast prefill keeps only those)."""
        logits = self.project_to_vocab(h).float()
        cap = self.config.final_logit_softcapping
        if cap:  # in place: [R, 262144] float32 is 1 MB a row; the values equal tanh(x / cap) * cap
            logits.div_(cap).tanh_().mul_(cap)
        return logits

    def _run_layers(self, layers, h, positions, ple, fb: ForwardBatch, rope=None, rows=None) -> torch.Tensor:
        """``layers`` on h [n, hidden]; with ``rows`` [R] the last layer writes every row's K/V and returns only
        those rows ([R, hidden]: yoco.attend)."""
        if rows is not None and not layers:
            return yoco.gather_rows(h, rows)
        rope = self.rope_tables(positions) if rope is None else rope
        last = len(layers) - 1
        for j, layer in enumerate(layers):
            cos, sin = rope[layer.layer_type]
            # layer.forward, not layer(...): no hooks are used, and nn.Module.__call__ costs per layer and step
            h = layer.forward(h, cos, sin, None if ple is None else ple[:, layer.layer_id], fb, rows if j == last else None)
        return h

    def self_decoder(self, h, positions, ple, fb: ForwardBatch, rope=None, rows=None) -> torch.Tensor:
        """Layers before the first KV-shared one, on every row; they write K/V. With ``rows`` (fast prefill) the
        last one computes only those rows past its K/V, and the result is [R, hidden]."""
        return self._run_layers(list(self.layers)[: self.first_kv_shared_layer], h, positions, ple, fb, rope, rows)

    def cross_decoder(self, h, positions, ple, fb: ForwardBatch, rope=None) -> torch.Tensor:
        """The KV-shared layers; they read their producers' K/V and write none."""
        return self._run_layers(list(self.layers)[self.first_kv_shared_layer :], h, positions, ple, fb, rope)

    @property
    def has_cross_decoder(self) -> bool:
        return self.first_kv_shared_layer < self.config.num_hidden_layers

    # ---- forward ------------------------------------------------------------
    @torch.no_grad()
    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        fb.attn_backend.init_forward_metadata(fb)
        h = self.embed(fb.input_ids)  # [T, hidden]
        ple = self.per_layer_inputs(fb.input_ids, h)  # [T, L, P] or None
        # Every row's rope: the self-decoder's, and the cross-decoder's when it runs every row (with fast prefill
        # the cross-decoder builds its own for the gathered rows' positions).
        rope = self.rope_tables(fb.positions)
        fast = bool(fb.fast_prefill) and self.has_cross_decoder
        if fast:
            rows = yoco.select_rows(fb)  # [R] == fb.logits_indices
            # before the self-decoder: its last layer already attends through this metadata (yoco.attend)
            fb.attn_backend.init_cross_decoder_metadata(fb, rows, fb.logits_lens_cpu)
            part = self.self_decoder(h, fb.positions, ple, fb, rope, rows)  # [R, hidden]
            part_pos = yoco.gather_rows(fb.positions, rows)
            part_ple = None if ple is None else yoco.gather_rows(ple, rows)
            part = self.cross_decoder(part, part_pos, part_ple, fb)
            cross_rows = int(part.shape[0])  # rows actually run, not rows expected
            hidden = self.norm(part)  # [R, hidden]
        else:
            h = self.self_decoder(h, fb.positions, ple, fb, rope)
            h = self.cross_decoder(h, fb.positions, ple, fb, rope)
            cross_rows = int(h.shape[0]) if self.has_cross_decoder else 0
            hidden = self.norm(h.index_select(0, fb.logits_indices))  # [R, hidden]
        return LogitsOutput(logits=self.compute_logits(hidden), hidden_states=hidden, cross_decoder_rows=cross_rows,
                            fast_prefill=fast)
