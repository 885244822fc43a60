"""Gemma-4 assistant (MTP draft model) running over the target model's stored K/V.

The assistant owns no KV at all: each of its layers is KV-shared with the
*target's* producer of the same layer type (the last non-shared target layer of
that type, the layers transformers marks "store"). One draft step:

    x = pre_projection(concat(target.embed(token), target_hidden))   # [n, 2*backbone] -> [n, hidden]
    x = layers(x)  (queries at ``positions`` over the target's K/V, no writes)
    h = norm(x)
    logits = lm_head(h)  (or the ordered-embedding masked head), no softcap
    next_hidden = post_projection(h)                                  # [n, backbone]

As in transformers' candidate generator, every step of a draft round uses the
position of the last token the target has seen (``p = seq_len - 1``) and the
same target K/V (positions ``0..p``); only the input token and hidden change.
Masks (transformers builds them bidirectional over the target's K/V): full
layers see every key ``0..p``; sliding layers see keys within distance ``W``
of ``p`` inclusive (``j >= p - W``, i.e. ``W + 1`` keys), hence the assistant's
sliding AttentionLayers carry ``sliding_window = W + 1`` under our
``j > p - window`` convention.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from impl.attention.base import AttentionLayer
from impl.config.model_config import ModelConfig
from impl.forward_batch import ForwardBatch, RowSpan
from impl.model.decoder_layer import Gemma4DecoderLayer
from impl.model.norm import RMSNorm
from impl.model.outputs import LogitsOutput
from impl.model import rope as rope_mod


class MaskedEmbedder(nn.Module):
    """Ordered-embedding LM head: score only the tokens of the top-k centroids, the rest get ``min - 1``."""

    def __init__(self, hidden: int, vocab: int, num_centroids: int, top_k: int, dtype: torch.dtype):
        super().__init__()
        if vocab % num_centroids:
            raise ValueError(f"assistant vocab_size {vocab} is not a multiple of num_centroids {num_centroids}.")
        self.centroids = nn.Linear(hidden, num_centroids, bias=False, dtype=dtype)
        self.token_ordering: torch.Tensor
        self.register_buffer("token_ordering", torch.zeros(vocab, dtype=torch.int64))
        self.num_centroids, self.top_k, self.vocab = num_centroids, top_k, vocab

    def forward(self, h: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        # h: [n, hidden] -> [n, vocab]
        n = h.shape[0]
        top = torch.topk(self.centroids(h), k=self.top_k, dim=-1).indices  # [n, k]
        per_cluster = self.token_ordering.long().view(self.num_centroids, -1)  # [C, vocab / C]
        cand = per_cluster[top].reshape(n, -1)  # [n, k * vocab / C] token ids
        scores = torch.einsum("nd,nmd->nm", h, lm_head_weight[cand])  # [n, m]
        # Per row (transformers takes the min over the whole batch; per row keeps a row batch-invariant).
        fill = scores.min(dim=-1, keepdim=True).values - 1.0
        out = fill.expand(n, self.vocab).clone()
        return out.scatter_(1, cand, scores)


class Gemma4AssistantForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        if not config.is_assistant:
            raise ValueError(f"Gemma4AssistantForCausalLM needs a gemma4_assistant config, got {config.model_type!r}.")
        self.config, self.dtype = config, dtype
        c = config
        with torch.device(device):
            # Placeholder layers until attach_target(): ids past any target layer, so they never look like producers.
            self.attention_layers = [self._layer(i, None, 10**6 + i) for i in range(c.num_hidden_layers)]
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, dtype=dtype)  # tied LM head only
            self.layers = nn.ModuleList(Gemma4DecoderLayer(c, i, al, dtype) for i, al in enumerate(self.attention_layers))
            self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=dtype)
            self.pre_projection = nn.Linear(2 * c.backbone_hidden_size, c.hidden_size, bias=False, dtype=dtype)
            self.post_projection = nn.Linear(c.hidden_size, c.backbone_hidden_size, bias=False, dtype=dtype)
            if c.use_ordered_embeddings:
                self.masked_embedding = MaskedEmbedder(
                    c.hidden_size, c.vocab_size, c.num_centroids, c.centroid_intermediate_top_k, dtype
                )
            if not c.tie_word_embeddings:
                self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=dtype)
        for p in self.parameters():
            p.requires_grad_(False)
        self.target_embed: Callable[[torch.Tensor], torch.Tensor] | None = None  # attach_target sets it

    def _layer(self, i: int, kv_layer_id: int | None, layer_id: int, target: ModelConfig | None = None) -> AttentionLayer:
        c = self.config
        window = c.sliding_window if c.is_sliding(i) else None
        return AttentionLayer(
            layer_id=layer_id,
            kv_layer_id=-1 if kv_layer_id is None else kv_layer_id,
            num_heads=c.num_attention_heads,
            num_kv_heads=c.layer_num_kv_heads[i] if target is None or kv_layer_id is None
            else target.layer_num_kv_heads[kv_layer_id],
            head_dim=c.layer_head_dims[i],
            scaling=1.0,
            sliding_window=None if window is None else window + 1,  # inclusive distance W, see module doc
        )

    def attach_target(self, target) -> None:
        """Bind to the target model: its embedding (the draft input) and its producer layers' K/V."""
        tc: ModelConfig = target.config
        if tc.hidden_size != self.config.backbone_hidden_size:
            raise ValueError(
                f"assistant backbone_hidden_size {self.config.backbone_hidden_size} != target hidden_size {tc.hidden_size}; "
                "this assistant was trained for a different target model."
            )
        first = tc.first_kv_shared_layer
        layers = []
        for i, t in enumerate(self.config.layer_types):
            producers = [j for j in range(first) if tc.layer_types[j] == t]
            if not producers:
                raise ValueError(f"assistant layer {i} is {t} but the target has no non-shared {t} layer to read K/V from.")
            kv = producers[-1]
            if tc.layer_head_dims[kv] != self.config.layer_head_dims[i]:
                raise ValueError(
                    f"assistant layer {i} head_dim {self.config.layer_head_dims[i]} != target layer {kv} head_dim "
                    f"{tc.layer_head_dims[kv]}; assistant and target do not match."
                )
            layers.append(self._layer(i, kv, tc.num_hidden_layers + i, tc))
        self.attention_layers = layers
        for mod, al in zip(self.layers, layers):
            assert isinstance(mod, Gemma4DecoderLayer)
            mod.self_attn.layer = al
            mod.layer_id = al.layer_id
        self.target_embed = target.embed

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def project_to_vocab(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head's matmul: h [n, hidden] -> [n, vocab] (the CPU transform installs a faster one)."""
        return F.linear(h, self.lm_head_weight())

    @torch.no_grad()
    def forward(self, fb: ForwardBatch, target_hidden: torch.Tensor) -> LogitsOutput:
        """One draft step. fb: one row per request (``draft_span``); target_hidden [n, backbone]."""
        return self.step(fb, target_hidden, self.prepare(fb))

    def _target_embed(self) -> Callable[[torch.Tensor], torch.Tensor]:
        if self.target_embed is None:
            raise ValueError("call attach_target(target_model) before running the assistant.")
        return self.target_embed

    def prepare(self, fb: ForwardBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """What every step of one draft round shares (the query position and the target's K/V do not
        change between steps): the attention metadata, built once, and the rope tables (returned)."""
        self._target_embed()  # attached, or a ValueError before anything runs
        fb.attn_backend.init_forward_metadata(fb)
        rope = {}
        for i, t in enumerate(self.config.layer_types):
            if t not in rope:
                inv = rope_mod.rope_inv_freq(self.config.rope[t], self.config.layer_head_dims[i])
                rope[t] = rope_mod.prepare_rope(*rope_mod.rope_cos_sin(fb.positions, inv, self.dtype))
        return rope

    @torch.no_grad()
    def step(self, fb: ForwardBatch, target_hidden: torch.Tensor, rope) -> LogitsOutput:
        """One draft step over metadata ``prepare(fb)`` built (``fb.input_ids`` may change between steps)."""
        x = torch.cat([self._target_embed()(fb.input_ids), target_hidden.to(self.dtype)], dim=-1)
        h = self.pre_projection(x)  # [n, hidden]
        for i, layer in enumerate(self.layers):
            cos, sin = rope[self.config.layer_types[i]]
            h = layer.forward(h, cos, sin, None, fb)  # no hooks: skip nn.Module.__call__ per layer and step
        h = self.norm(h)
        if self.config.use_ordered_embeddings:
            logits = self.masked_embedding(h, self.lm_head_weight())
        else:
            logits = self.project_to_vocab(h)
        return LogitsOutput(logits=logits.float(), hidden_states=self.post_projection(h))


def draft_span(req_pool_idx: int, seq_len: int, token: int) -> RowSpan:
    """One request's row of a draft step (``pack_forward_batch``; a batch of these is DECODE-shaped): ``token``
    queried at ``seq_len - 1``, the last position with K/V in the target's pool, over keys ``0 .. seq_len - 1``;
    it writes no K/V (every assistant layer is KV-shared)."""
    return RowSpan(req_pool_idx, seq_len - 1, [token], None)
