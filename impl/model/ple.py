"""Per-layer embeddings (PLE): a per-token, per-layer input added by every decoder layer.

``per_layer_inputs = (norm(proj(embeds) * hidden^-0.5) + table[ids] * sqrt(ple_dim)) * 2^-0.5``
with shape [T, num_layers, ple_dim]; layer ``i`` reads ``[:, i]``. The weights live
on the model under their checkpoint names (embed_tokens_per_layer,
per_layer_model_projection, per_layer_projection_norm).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

# The 2^-0.5 that averages the projection and the table; a module constant so a
# mutant ("missing PLE scale") can set it to 1.0.
PER_LAYER_INPUT_SCALE = 2.0**-0.5


def per_layer_inputs(
    input_ids: torch.Tensor,  # [T]
    embeds: torch.Tensor,  # [T, hidden], already scaled by sqrt(hidden)
    table: nn.Embedding,  # [vocab_ple, L * P]
    projection: nn.Linear,  # hidden -> L * P
    norm: nn.Module,  # RMSNorm(P)
    num_layers: int,
    fused: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:  # [T, L, P]
    """``fused``: a bf16 model's one-pass kernel of this formula (impl/kernels/cpu_fused/transform.py
    ``PleInputsKernel``; each step rounded to bf16 as the ops below round it)."""
    p = table.weight.shape[1] // num_layers
    # a table narrower than the model dtype (loader.WeightPlan) is widened row by row, then scaled
    # a table mapped from the checkpoint (loader.WeightPlan) gathers through its FileRows: same values, no pages
    # of the mapping made resident
    rows = getattr(table, "file_rows", None)
    tok = (rows(input_ids) if rows is not None else table(input_ids)).to(embeds.dtype)
    tok_scale = torch.tensor(math.sqrt(p), dtype=embeds.dtype)
    if fused is not None and embeds.dtype == torch.bfloat16:
        w = norm.weight if norm.with_scale else torch.ones(p)
        out = fused(embeds, tok, w.float(), norm.eps, p, float(tok_scale), PER_LAYER_INPUT_SCALE)
        return out.view(-1, num_layers, p)
    tok = tok * tok_scale
    tok = tok.view(-1, num_layers, p)
    proj = projection(embeds) * (embeds.shape[-1] ** -0.5)
    proj = norm(proj.view(-1, num_layers, p))
    return (proj + tok) * PER_LAYER_INPUT_SCALE
