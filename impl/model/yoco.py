"""YOCO fast prefill row plumbing: which rows go through the cross-decoder, and moving them.

The cross-decoder (KV-shared layers) writes no KV, so its output matters only at
the rows that feed the LM head: ``fb.logits_indices`` (sorted, grouped per
request, ``fb.logits_lens_cpu`` rows each; always including each request's last
row). Everything that is per row (hidden state, position, PLE input) is gathered
with the same index so RoPE and PLE follow the rows.

The last self-decoder layer is cut at the same place: every row's K/V must be
written (later chunks, decode steps and the cross-decoder read them), but its
attention output, MLP and PLE feed only the next layer, the cross-decoder's first,
so they too run on the selected rows alone (``attend``). On E2B that is the one
full-attention layer 14 minus its q/k/v projections: ~7% of a flag-on prefill's
FLOPs. The selected rows get the bits they get with the flag off: the same kernels
on the same rows as the cross-decoder's layers.
"""

from __future__ import annotations

import torch

from impl.attention.base import AttentionLayer
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


def attend(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: AttentionLayer, fb: ForwardBatch,
           rows: torch.Tensor | None) -> torch.Tensor:
    """The backend's attention for q [n, H * D] (k / v [n, Hkv * D], or None in a KV-shared layer) -> [n, H * D].
    With ``rows`` (the last self-decoder layer under fast prefill, after ``init_cross_decoder_metadata``) every
    row's K/V is written and only those rows' queries attend, over the whole context -> [R, H * D]."""
    if rows is None:
        return fb.attn_backend.forward(q, k, v, layer, fb)
    if k is None or v is None:
        raise ValueError(f"layer {layer.layer_id} reads another layer's K/V: only a layer that writes K/V is cut "
                         "at the selected rows (the last self-decoder layer)")
    fb.attn_backend.store_kv(k, v, layer, fb)
    return fb.attn_backend.forward(q.index_select(0, rows), None, None, layer, fb)
