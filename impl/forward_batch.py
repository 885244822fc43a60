"""ForwardBatch: one packed forward pass (SGLang's name and shape, reduced).

A batch packs the new tokens of ``B`` requests into ``T`` rows. Request ``i``
owns rows ``[extend_start_loc[i], extend_start_loc[i] + extend_seq_lens[i])``;
it already has ``extend_prefix_lens[i]`` tokens in the KV cache and will have
``seq_lens[i] = prefix + extend`` after this pass. Decode is the special case
``extend_seq_lens == 1`` for every request; a *mixed* batch (prefill chunks and
decode steps together) is an EXTEND batch where some requests extend by one.

Invariants (checked in ``__post_init__``):
* ``sum(extend_seq_lens) == T == len(input_ids) == len(positions) == len(out_cache_loc)``
* ``seq_lens == extend_prefix_lens + extend_seq_lens``
* ``positions`` of request ``i`` run ``prefix_i .. seq_len_i - 1``
* ``logits_indices`` is sorted and every entry is a row of its request; the last
  row of every request is in it (the row that is sampled, or, for a partial
  chunked-prefill chunk, the row whose output is discarded).

Every batch is packed by ``pack_forward_batch`` from one ``RowSpan`` per request:
the scheduler's prefill / decode / mixed batches (``ScheduleBatch.to_forward_batch``),
speculative verify batches (``engine/speculative/frozen_kv_mtp_worker.py``) and the
assistant's draft steps (``model/assistant.py:draft_span``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # at least one request adds more than one token (or has a prefix to attend to)
    DECODE = "decode"  # every request adds exactly one token

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    @property
    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND


@dataclass
class WorkCounters:
    """Rows each layer group processed, summed over forwards (read by the WORK contract)."""

    forwards: int = 0
    extend_forwards: int = 0
    fast_prefill_forwards: int = 0
    self_decoder_rows: int = 0
    cross_decoder_rows: int = 0
    lm_head_rows: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    skipped_cross_decoder_rows: int = 0  # rows fast prefill did not run through the cross-decoder

    def count_forward(self, extend: bool, rows: int, lm_head_rows: int, cross_decoder_rows: int, fast_prefill: bool) -> None:
        """One model forward as the model reported it (``LogitsOutput``): ``rows`` tokens through the
        self-decoder, ``cross_decoder_rows`` through the KV-shared layers, ``lm_head_rows`` logits rows."""
        self.forwards += 1
        self.extend_forwards += int(extend)
        self.self_decoder_rows += rows
        self.cross_decoder_rows += cross_decoder_rows
        self.lm_head_rows += lm_head_rows
        if fast_prefill:
            self.fast_prefill_forwards += 1
            self.skipped_cross_decoder_rows += rows - cross_decoder_rows

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def reset(self) -> None:
        for k in self.__dict__:
            setattr(self, k, 0)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each row in its sequence
    req_pool_indices: torch.Tensor  # [B] int64, rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64, prefix + extend
    extend_prefix_lens: torch.Tensor  # [B] int64
    extend_seq_lens: torch.Tensor  # [B] int64
    out_cache_loc: torch.Tensor  # [T] int64, KV slots the new rows write
    logits_indices: torch.Tensor  # [R] int64, rows that feed the LM head
    # Host copies: metadata builders use these without a device sync.
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    logits_lens_cpu: list[int] = field(default_factory=list)  # rows of logits_indices per request
    # Resources (set by the model runner).
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    attn_backend: Any = None
    # YOCO: set by the model runner when --kv-sharing-fast-prefill is on and the
    # batch extends some request by more than one token.
    fast_prefill: bool = False
    # A speculative verify batch (SGLang's TARGET_VERIFY): every request extends by 1 + steps rows, all
    # LM-head rows. Attention backends may run its rows like decode rows (one query each, own position).
    spec_verify: bool = False
    work: WorkCounters | None = None

    def __post_init__(self) -> None:
        if not self.seq_lens_cpu:
            self.seq_lens_cpu = self.seq_lens.tolist()
        if not self.extend_prefix_lens_cpu:
            self.extend_prefix_lens_cpu = self.extend_prefix_lens.tolist()
        if not self.extend_seq_lens_cpu:
            self.extend_seq_lens_cpu = self.extend_seq_lens.tolist()
        if not self.logits_lens_cpu:
            self.logits_lens_cpu = [1] * self.batch_size
        t = int(self.input_ids.shape[0])
        assert sum(self.extend_seq_lens_cpu) == t, "extend_seq_lens must sum to the number of rows"
        assert self.positions.shape[0] == t and self.out_cache_loc.shape[0] == t, "per-row tensors disagree in length"
        assert all(
            s == p + e for s, p, e in zip(self.seq_lens_cpu, self.extend_prefix_lens_cpu, self.extend_seq_lens_cpu)
        ), "seq_lens must equal extend_prefix_lens + extend_seq_lens"
        assert sum(self.logits_lens_cpu) == int(self.logits_indices.shape[0]), "logits_lens must sum to len(logits_indices)"

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def extend_start_loc_cpu(self) -> list[int]:
        out, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            out.append(acc)
            acc += n
        return out

    @property
    def last_row_indices_cpu(self) -> list[int]:
        """Index of each request's last new row (extend lens [3,4,2] -> [2,6,8])."""
        return last_rows(self.extend_seq_lens_cpu)


def last_rows(extend_seq_lens: list[int]) -> list[int]:
    """Rows of the last token of each request in a packed batch: [3,4,2] -> [2,6,8]."""
    out, acc = [], 0
    for n in extend_seq_lens:
        acc += n
        out.append(acc - 1)
    return out


@dataclass(frozen=True)
class RowSpan:
    """One request's rows in a packed batch: its tokens at positions ``start .. start + n - 1``."""

    req_pool_idx: int  # the request's row of req_to_token
    start: int  # tokens it has K/V for before this forward (the position of its first row)
    input_ids: Sequence[int]  # [n] the tokens of its rows
    out_cache_loc: torch.Tensor | None  # [n] KV slots the rows write; None: the rows write no K/V (a draft step)
    logits_rows: Sequence[int] | None = None  # offsets 0..n-1 that feed the LM head, ending with n - 1; None: all

    @property
    def n(self) -> int:
        return len(self.input_ids)


def pack_forward_batch(
    spans: Sequence[RowSpan],
    device: torch.device | str,
    *,
    mode: ForwardMode | None = None,
    spec_verify: bool = False,
    work: WorkCounters | None = None,
    req_to_token_pool: Any = None,
    token_to_kv_pool: Any = None,
    attn_backend: Any = None,
) -> ForwardBatch:
    """The one ForwardBatch packer: the spans' rows in order, request ``i`` extending ``spans[i].n``
    tokens after ``spans[i].start``. ``mode`` None: DECODE when every span has one row, else EXTEND (a
    verify batch is EXTEND whatever its lengths). The resources are usually set by the model runner."""
    ids: list[int] = []
    pos: list[int] = []
    logits_idx: list[int] = []
    logits_lens: list[int] = []
    row0 = 0
    for sp in spans:
        n = sp.n
        ids.extend(sp.input_ids)
        pos.extend(range(sp.start, sp.start + n))
        rows = range(n) if sp.logits_rows is None else sp.logits_rows
        logits_idx.extend(row0 + o for o in rows)
        logits_lens.append(len(rows))
        row0 += n
    written = [sp.out_cache_loc for sp in spans if sp.out_cache_loc is not None]
    if len(written) == len(spans):
        out_cache_loc = torch.cat(written).to(device)
    elif not written:  # never written: the rows only read K/V (pad slot 0 as a placeholder)
        out_cache_loc = torch.zeros(row0, dtype=torch.int64, device=device)
    else:
        raise ValueError("a packed batch writes K/V for the rows of every span or of none")
    prefix = [sp.start for sp in spans]
    ext = [sp.n for sp in spans]
    seq = [p + e for p, e in zip(prefix, ext)]
    if mode is None:
        mode = ForwardMode.DECODE if all(e == 1 for e in ext) else ForwardMode.EXTEND

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    return ForwardBatch(
        forward_mode=mode,
        input_ids=t(ids),
        positions=t(pos),
        req_pool_indices=t([sp.req_pool_idx for sp in spans]),
        seq_lens=t(seq),
        extend_prefix_lens=t(prefix),
        extend_seq_lens=t(ext),
        out_cache_loc=out_cache_loc,
        logits_indices=t(logits_idx),
        seq_lens_cpu=seq,
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext,
        logits_lens_cpu=logits_lens,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=token_to_kv_pool,
        attn_backend=attn_backend,
        spec_verify=spec_verify,
        work=work,
    )
