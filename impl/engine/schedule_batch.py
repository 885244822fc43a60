"""ScheduleBatch: what the scheduler decided for one forward, and its ForwardBatch.

Each ``BatchItem`` extends one request by ``n`` tokens starting at position
``start`` (its ``kv_len`` before this forward). Decode items have ``n == 1``;
a mixed batch holds prefill chunks and decode steps together (an EXTEND batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from impl.forward_batch import ForwardBatch, ForwardMode, RowSpan, WorkCounters, pack_forward_batch
from impl.engine.req import Req


@dataclass
class BatchItem:
    req: Req
    start: int  # tokens already in the KV cache before this forward
    n: int  # tokens this forward adds
    out_cache_loc: torch.Tensor  # [n] int64 slots the new rows write
    logits_rows: list[int] = field(default_factory=list)  # offsets 0..n-1 that feed the LM head
    # The request catches up in this forward, so its last row is sampled (fixed at
    # scheduling time: seq_len grows once the token is appended).
    samples: bool = False
    # Adds just the last sampled token (a decode token, not a prefill token).
    is_decode_step: bool = False

    def __post_init__(self) -> None:
        self.samples = self.start + self.n == self.req.seq_len
        self.is_decode_step = self.n == 1 and bool(self.req.output_ids) and self.samples


@dataclass
class ScheduleBatch:
    items: list[BatchItem]
    cached_tokens: int = 0  # cached prefix tokens the requests admitted for this forward reuse

    @property
    def is_pure_decode(self) -> bool:
        return all(it.is_decode_step for it in self.items)

    @property
    def has_decode(self) -> bool:
        return any(it.is_decode_step for it in self.items)

    def work_counters(self) -> WorkCounters:
        return WorkCounters(
            prefill_tokens=sum(it.n for it in self.items if not it.is_decode_step),
            decode_tokens=sum(1 for it in self.items if it.is_decode_step),
            cached_tokens=self.cached_tokens,
        )

    @property
    def num_tokens(self) -> int:
        return sum(it.n for it in self.items)

    @property
    def forward_mode(self) -> ForwardMode:
        return ForwardMode.DECODE if all(it.n == 1 for it in self.items) else ForwardMode.EXTEND

    def to_forward_batch(self, device: torch.device) -> ForwardBatch:
        """Each item's rows ``fill_ids[start : start + n]``, packed by the one packer."""
        spans = [RowSpan(it.req.pool_idx, it.start, it.req.fill_ids[it.start : it.start + it.n], it.out_cache_loc,
                         it.logits_rows) for it in self.items]
        return pack_forward_batch(spans, device, mode=self.forward_mode)


@dataclass(frozen=True)
class SpeculativeRound:
    """The scheduler's other answer when no prefill is scheduled and a decode worker is on: advance the
    running requests by one draft + verify round (``DecodeWorker.run_round``) instead of one forward."""
