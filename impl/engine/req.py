"""Req: one generation request's state inside the scheduler.

Token bookkeeping (page size 1): ``fill_ids = origin_input_ids + output_ids``, one
list kept as the output grows (``append_output``), never rebuilt per step.
The request's first ``kv_len`` tokens have KV in the pool at
``req_to_token[req_pool_idx, :kv_len]``; the first ``prefix_len`` of those
are a radix-cache prefix (locked at ``last_node``, owned by the tree), the
rest belong to the request. Each forward extends the request by
``fill_ids[kv_len : kv_len + n]``: a prefill chunk, or the last sampled token
in decode. A token is sampled when the request has caught up
(``kv_len == len(fill_ids)`` after the forward).

Prompt logprobs (SGLang's definition): the logprob of prompt token ``j`` comes
from the logits at the row of token ``j - 1``; the entries run over tokens
``logprob_start_len .. prompt_len - 1`` and the entry of token 0 is None.
So rows of positions ``max(logprob_start_len - 1, 0) .. prompt_len - 2`` feed
the LM head besides each request's last row; ``input_logprob_next_pos`` is the
next such row still to compute (it survives retraction).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from impl.sampling.sampling_params import SamplingParams


class ReqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None  # set when the request failed (500: engine fault, 503: engine unhealthy)

    def to_json(self) -> dict[str, Any]:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        out: dict[str, Any] = {"type": "abort", "message": self.message}
        if self.status_code is not None:
            out["status_code"] = self.status_code
        return out


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    generator: torch.Generator | None = None
    on_output: Callable[["Req"], None] | None = None  # called on the scheduler thread after progress
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    finished_reason: FinishReason | None = None
    # KV bookkeeping
    req_pool_idx: int | None = None
    kv_len: int = 0
    prefix_len: int = 0
    last_node: Any = None
    swa_lock: int | None = None  # the window lock on the cached prefix (hybrid pool's radix cache)
    swa_evicted_len: int = 0  # hybrid pool: own tokens below this gave their sliding-window slot back
    swa_query_from: int = 0  # hybrid pool: first query position of the forward being built (kv_len before it)
    cached_tokens: int = 0  # prefix-cache hit at first admission (meta_info.cached_tokens)
    admitted_once: bool = False
    num_retractions: int = 0
    # logprobs: (logprob, token_id) pairs; prompt entries may be (None, token_id)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    # each prompt entry's rank in its row (1: the most likely; ties count against it; None for token 0), when
    # asked (vLLM's prompt_logprobs): None, else a list growing with input_token_logprobs
    input_token_ranks: list[int | None] | None = None
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_logprob_next_pos: int = 0
    # the radix cache's namespace (vLLM's / SGLang's cache_salt, hashed; 0: the shared one): prefixes are shared only
    # between requests of one namespace (``impl/engine/kv_prefix.py``)
    cache_namespace: int = 0
    # text: the request's IncrementalDetokenizer (set by Engine.submit; stepped on the scheduler
    # thread only when the request has stop strings, else on the detokenizer thread)
    detok: Any = None
    # stop strings: where in the decoded output text the matched stop string starts
    stop_text_pos: int | None = None
    stop_checked_chars: int = 0
    # timing
    created_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finished_time: float | None = None
    last_emitted_len: int = 0
    # speculative decoding (FROZEN_KV_MTP): None when the engine does not speculate
    spec_verify_ct: int | None = None  # verify forwards this request took part in
    spec_committed_tokens: int = 0  # tokens those verifies committed
    spec_hidden: torch.Tensor | None = None  # seed: target hidden of the row that produced the last token
    # constrained decoding: this sequence's matcher (impl/constrained/grammar.py GrammarState), advanced by
    # every committed token; None when the request has no json_schema / regex / ebnf
    grammar: Any = None
    fill_ids: list[int] = field(init=False, repr=False)  # origin_input_ids + output_ids

    def seed_hidden(self) -> torch.Tensor:
        """``spec_hidden``, which a drafter needs: set by the verify (or prefill) that committed the last token."""
        if self.spec_hidden is None:
            raise ValueError(f"request {self.rid} has no seed hidden state to draft from")
        return self.spec_hidden

    @property
    def spec_accept_length(self) -> float | None:
        """Mean tokens committed per verify (SGLang's ``spec_accept_length``)."""
        if self.spec_verify_ct is None:
            return None
        return self.spec_committed_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def __post_init__(self) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        if self.return_logprob and self.logprob_start_len >= 0:
            self.input_logprob_next_pos = max(self.logprob_start_len - 1, 0)
            if self.logprob_start_len == 0:
                self.input_token_logprobs.append((None, self.origin_input_ids[0]))
                self.input_top_logprobs.append(None)
                if self.input_token_ranks is not None:
                    self.input_token_ranks.append(None)
        else:
            self.input_logprob_next_pos = len(self.origin_input_ids)  # nothing to compute

    def append_output(self, tok: int) -> None:
        """One generated token: the only way the output grows (``fill_ids`` grows with it)."""
        self.output_ids.append(tok)
        self.fill_ids.append(tok)

    @property
    def pool_idx(self) -> int:
        """``req_pool_idx``, which a request that holds KV (one in a batch) has."""
        assert self.req_pool_idx is not None, f"request {self.rid} holds no req_to_token row"
        return self.req_pool_idx

    @property
    def seq_len(self) -> int:
        return len(self.fill_ids)

    @property
    def is_finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def wants_input_logprobs(self) -> bool:
        """Some prompt-logprob rows are still to compute (they stop at prompt_len - 2)."""
        return self.input_logprob_next_pos < len(self.origin_input_ids) - 1

    def max_prefix_len(self) -> int:
        """Longest cached prefix usable now: at least one token must be extended (its row
        is sampled), and rows still needed for prompt logprobs must be computed."""
        limit = self.seq_len - 1
        if self.wants_input_logprobs:
            limit = min(limit, self.input_logprob_next_pos)
        return max(limit, 0)

    def logits_rows(self, start: int, n: int) -> list[int]:
        """Offsets (0..n-1) of this request's rows that feed the LM head when it extends
        positions ``start .. start+n-1``: prompt-logprob rows, then the last row."""
        rows: list[int] = []
        if self.wants_input_logprobs:
            lo = max(self.input_logprob_next_pos, start)
            hi = min(len(self.origin_input_ids) - 1, start + n)
            rows = list(range(lo - start, hi - start))
        if not rows or rows[-1] != n - 1:
            rows.append(n - 1)
        return rows
