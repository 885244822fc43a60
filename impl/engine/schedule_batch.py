"""ScheduleBatch: what the scheduler decided for one forward, and its ForwardBatch.

Each ``BatchItem`` extends one request by ``n`` tokens starting at position
``start`` (its ``kv_len`` before this forward). Decode items have ``n == 1``;
a mixed batch holds prefill chunks and decode steps together (an EXTEND batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from impl.forward_batch import ForwardBatch, ForwardMode
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

    @property
    def num_tokens(self) -> int:
        return sum(it.n for it in self.items)

    @property
    def forward_mode(self) -> ForwardMode:
        return ForwardMode.DECODE if all(it.n == 1 for it in self.items) else ForwardMode.EXTEND

    def to_forward_batch(self, req_to_token_pool, token_to_kv_pool, device: torch.device) -> ForwardBatch:
        ids: list[int] = []
        pos: list[int] = []
        logits_idx: list[int] = []
        row0 = 0
        for it in self.items:
            ids.extend(it.req.fill_ids[it.start : it.start + it.n])
            pos.extend(range(it.start, it.start + it.n))
            logits_idx.extend(row0 + o for o in it.logits_rows)
            row0 += it.n
        prefix = [it.start for it in self.items]
        ext = [it.n for it in self.items]
        seq = [p + e for p, e in zip(prefix, ext)]

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=device)

        return ForwardBatch(
            forward_mode=self.forward_mode,
            input_ids=t(ids),
            positions=t(pos),
            req_pool_indices=t([it.req.req_pool_idx for it in self.items]),
            seq_lens=t(seq),
            extend_prefix_lens=t(prefix),
            extend_seq_lens=t(ext),
            out_cache_loc=torch.cat([it.out_cache_loc for it in self.items]).to(device),
            logits_indices=t(logits_idx),
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=ext,
            logits_lens_cpu=[len(it.logits_rows) for it in self.items],
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
        )
