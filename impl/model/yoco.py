"""YOCO fast prefill row plumbing: which rows go through the cross-decoder, and moving them.

The cross-decoder (KV-shared layers) writes no KV, so its output matters only at
the rows that feed the LM head: ``fb.logits_indices`` (sorted, grouped per
request, ``fb.logits_lens_cpu`` rows each; always including each request's last
row). Everything that is per row (hidden state, position, PLE input) is gathered
with the same index so RoPE and PLE follow the rows.
"""

from __future__ import annotations

import torch

from impl.forward_batch import ForwardBatch


def applies(enabled: bool, extend_seq_lens: list[int]) -> bool:
    """Fast prefill runs when the flag is on and the batch extends some request by more than one
    token; pure decode batches (every request adds one row, all of which feed the LM head) gain
    nothing and take the normal path."""
    return enabled and any(n > 1 for n in extend_seq_lens)


def select_rows(fb: ForwardBatch) -> torch.Tensor:
    """[R] int64 batch rows the cross-decoder must compute (the LM-head rows)."""
    return fb.logits_indices


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [T, ...] -> [R, ...] (a copy: the cross-decoder must not write into the full buffer)."""
    return x.index_select(0, rows)


def scatter_rows(full: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """Write ``part`` [R, ...] back into ``full`` [T, ...] at ``rows``; the other rows keep the self-decoder output."""
    return full.index_copy(0, rows, part)
