"""What a model forward returns to the engine."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LogitsOutput:
    logits: torch.Tensor  # [R, vocab] float32, rows fb.logits_indices in that order
    hidden_states: torch.Tensor | None = None  # [R, hidden] after the final norm (the assistant's input)
    # What the forward ran, for the engine's work counters (the WORK contract): rows the KV-shared layers
    # (cross-decoder) ran (0 without such layers) and whether the fast-prefill split ran.
    cross_decoder_rows: int = 0
    fast_prefill: bool = False
