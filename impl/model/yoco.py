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


def pad_lone_row(rows: torch.Tensor, rows_per_req: list[int]) -> tuple[torch.Tensor, list[int], bool]:
    """A lone selected row is computed twice: (the rows and the counts the cross-decoder runs with, padded?).

    Why: oneDNN's linear takes another kernel for a single row (a gemv) whose rounding differs from its
    multi-row kernel, and the multi-row kernel's rows do not depend on how many rows it gets (bit-identical for
    2 to 1024 rows of a prepacked bf16 weight). Flag off runs the cross-decoder on every row of an extend batch
    (always 2 or more), so with a lone row padded to two, flag on computes that row with the same kernel and
    the same bits, and greedy ids stay identical on full-size weights too. The duplicate costs one row's
    arithmetic (the weights are read once either way); pure decode batches are not fast prefill and keep
    their single-row kernel. The attention backend computes each copy as a lone row
    (``init_cross_decoder_metadata(..., lone_row_twice=True)``)."""
    if int(rows.shape[0]) != 1:
        return rows, rows_per_req, False
    owner = next(i for i, n in enumerate(rows_per_req) if n > 0)
    counts = list(rows_per_req)
    counts[owner] += 1
    return rows.repeat(2), counts, True


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [T, ...] -> [R, ...] (a copy: the cross-decoder must not write into the full buffer)."""
    return x.index_select(0, rows)


def scatter_rows(full: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """Write ``part`` [R, ...] back into ``full`` [T, ...] at ``rows``; the other rows keep the self-decoder output."""
    return full.index_copy(0, rows, part)
