"""Token bitmasks applied to logits rows (xgrammar's layout: bit ``t % 32`` of word ``t // 32`` allows token ``t``).

Masked tokens get ``-inf``, so everything after (penalties, temperature,
top-k / top-p / min-p, the draw and the reported logprobs) sees the
constrained distribution, as in SGLang. Columns beyond the bitmask (logits
wider than the token table) are masked as well.
"""

from __future__ import annotations

from typing import Sequence

import torch


def allocate(batch: int, vocab_size: int) -> torch.Tensor:
    """[batch, ceil(vocab_size / 32)] int32, every token allowed (-1 = all bits set)."""
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Mask ``logits[rows]`` in place. logits: [B, V] float32 (contiguous); bitmask: [B, W] int32."""
    if not rows:
        return
    import xgrammar as xgr

    width = bitmask.shape[1] * 32
    vocab = min(logits.shape[1], width)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=vocab, indices=list(rows))
    if logits.shape[1] > width:  # LM-head columns the token table does not cover
        logits[list(rows), width:] = float("-inf")


def allowed_ids(bitmask_row: torch.Tensor, vocab_size: int) -> list[int]:
    """Token ids a bitmask row allows (for tests and debugging)."""
    bits = (bitmask_row.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1  # [W, 32]
    return [t for t in bits.flatten().nonzero().flatten().tolist() if t < vocab_size]
