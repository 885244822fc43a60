"""Scheduler: waiting / running queues and one forward per ``step()``.

Each step: take new requests and aborts from the (thread-safe) inbox; give
every running request one decode token, retracting the newest requests while
the KV pool cannot hold that; then fill the prefill budget: first the
in-progress chunked request, then waiting requests in order (``fcfs``, or
longest cached prefix first with ``lpm``) while the KV budget (free plus
evictable slots, less a reserve for the running requests' future tokens)
admits them. Prefill chunks and decode steps run in one mixed forward.

Chunked prefill (SGLang's ``--chunked-prefill-size``): at most that many
prefill tokens per forward; a longer prompt is split into chunks, one chunked
request at a time, and its partial chunks are not sampled. ``-1`` disables
chunking (a prompt is prefilled whole; ``--max-prefill-tokens`` then bounds a
batch but never blocks the first request).

Preemption (retraction): the request's computed KV goes to the radix cache
(or back to the allocator), it keeps its output tokens, prompt logprobs and
random generator, and re-enters the front of the waiting queue; its re-prefill
covers prompt plus output, so its tokens stay the same.

Speculative decoding plugs in as a decode worker (``impl/engine/speculative/base.py``):
it advances the running requests in rounds through this class's public seam
(``make_room_for_decode``, ``run_forward`` / ``run_isolated``, ``commit``,
``decode_step_done``), the same methods the one-token decode path uses.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from impl.constrained.bitmask import allocate as allocate_bitmask
from impl.engine.fault_isolation import FaultIsolation
from impl.forward_batch import ForwardBatch, WorkCounters
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import FinishReason, Req, ReqState
from impl.engine.schedule_batch import BatchItem, ScheduleBatch
from impl.model.outputs import LogitsOutput
from impl.sampling.sampler import SampleRow, sample

if TYPE_CHECKING:
    from impl.engine.speculative.base import DecodeWorker

logger = logging.getLogger("impl.engine")

# _schedule's answer "run a speculative draft + verify round for the running requests"
_SPEC_ROUND = ScheduleBatch([])


@dataclass
class SchedulerConfig:
    max_running_requests: int
    chunked_prefill_size: int  # -1: chunking off
    max_prefill_tokens: int
    max_req_len: int  # prompt + output tokens one request may reach
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int | None = None
    stream_interval: int = 1
    schedule_policy: str = "fcfs"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    check_integrity_when_idle: bool = True

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens


@dataclass
class DecodeStepTimes:
    """Wall time of pure decode steps, split into the model forward and everything else on the
    scheduler thread (scheduling, batch building, sampling over the vocabulary, stop checks): what the
    large-vocabulary work costs per step (``/get_server_info`` ``decode_step_times``)."""

    steps: int = 0
    rows: int = 0
    total_s: float = 0.0
    forward_s: float = 0.0

    def add(self, rows: int, total_s: float, forward_s: float) -> None:
        self.steps += 1
        self.rows += rows
        self.total_s += total_s
        self.forward_s += forward_s

    def as_dict(self) -> dict[str, float]:
        n = max(self.steps, 1)
        return {"steps": self.steps, "rows": self.rows, "total_s": self.total_s, "forward_s": self.forward_s,
                "outside_model_ms_per_step": 1e3 * (self.total_s - self.forward_s) / n,
                "forward_ms_per_step": 1e3 * self.forward_s / n}


class Scheduler(FaultIsolation):
    def __init__(
        self,
        config: SchedulerConfig,
        runner,  # .forward(fb) -> LogitsOutput (logits [R, V]); .req_to_token_pool, .token_to_kv_pool, .device
        kv: KVLifecycle,
        spec: "DecodeWorker | None" = None,  # FrozenKVMTPWorker when speculative decoding is on
    ):
        self.config = config
        self.spec = spec
        self.runner = runner
        self.kv = kv
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.new_token_ratio = config.init_new_token_ratio
        self.num_retractions = 0
        self.num_forwards = 0
        self.decode_times = DecodeStepTimes()
        self._idle_checked = False
        self.unhealthy: str | None = None  # set once by a failed integrity check (fault_isolation.py)

    # ---- thread-safe entry points ---------------------------------------------
    def add_request(self, req: Req) -> None:
        if req.sampling_params.stop and req.detok is None:
            raise ValueError(f"request {req.rid} has stop strings but no detokenizer (Engine.submit sets req.detok)")
        self.inbox.put(("add", req))

    def abort_request(self, rid: str | None) -> None:
        """Abort one request by id (None: all)."""
        self.inbox.put(("abort", rid))

    # ---- the loop ---------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req or not self.inbox.empty())

    @property
    def live_reqs(self) -> list[Req]:
        return self.running + ([self.chunked_req] if self.chunked_req else [])

    def step(self) -> bool:
        """Run at most one forward. Returns False when there was nothing to do."""
        t_start = time.perf_counter()
        self.process_inbox()
        if self.unhealthy is not None:
            return False
        batch = self._schedule()
        if batch is None:
            # Once per transition to idle (the background loop polls while idle).
            if self.config.check_integrity_when_idle and not self.has_work and not self._idle_checked:
                self._idle_checked = True
                self.check_integrity_or_mark("when the engine went idle")
            return False
        self._idle_checked = False
        if batch is _SPEC_ROUND:
            assert self.spec is not None
            self.spec.run_round(self)
            return True
        fb = batch.to_forward_batch(self.device)
        fb.work = WorkCounters(
            prefill_tokens=sum(it.n for it in batch.items if not it.is_decode_step),
            decode_tokens=sum(1 for it in batch.items if it.is_decode_step),
            cached_tokens=self._cached_this_step,
        )
        t_fwd = time.perf_counter()
        out = self.run_forward(fb, [it.req for it in batch.items])
        t_fwd = time.perf_counter() - t_fwd
        if out is None:
            return True
        if self.spec is not None:
            self.spec.after_forward(batch, out.hidden_states)
        self._process(batch, out.logits)
        if all(it.is_decode_step for it in batch.items):
            self.decode_times.add(len(batch.items), time.perf_counter() - t_start, t_fwd)
        return True

    # ---- the seam: what the decode path and a decode worker use (speculative/base.py) ----------
    @property
    def device(self) -> torch.device:
        return self.runner.device

    def run_forward(self, fb: ForwardBatch, reqs: Sequence[Req]) -> LogitsOutput | None:
        """The model's forward of ``fb``, whose rows are ``reqs``', fault-isolated (``fault_isolation.py``):
        None when it raised, and then ``reqs`` have been failed (one error final output each, their KV
        freed) and the KV integrity checked; the other requests are untouched."""
        out = self.run_isolated(reqs, lambda: self.runner.forward(fb))
        if out is not None:
            self.num_forwards += 1
        return out

    def make_room_for_decode(self) -> list[Req]:
        """Every running request is about to add at least one token: retract the newest (the chunked
        request first) while the KV pool cannot give each one more slot. The running requests left."""
        while self.running and self.kv.available() < len(self.running):
            if self.chunked_req is not None:
                victim, self.chunked_req = self.chunked_req, None
            else:
                victim = self.running.pop()
            self.retract(victim)
        return list(self.running)

    def retract(self, req: Req) -> None:
        """Preempt ``req``: its KV goes to the cache (or the allocator) and it re-enters the front of the
        waiting queue, keeping its output (its re-prefill covers prompt plus output)."""
        self.kv.release(req)
        req.state = ReqState.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)
        self.new_token_ratio = self.config.init_new_token_ratio
        logger.info("retracted request %s (KV pool short); it will be prefilled again", req.rid)

    def commit(self, req: Req, tokens: Sequence[int], logprobs: Sequence[float | None] | None = None,
               top_logprobs: Sequence[Any] | None = None, *, verified: bool = False) -> int:
        """Append ``tokens``, the model's next tokens for ``req`` in order, one at a time through the
        per-token path: output and logprobs grow, then ``max_new_tokens``, EOS and stop tokens, the
        context length and stop strings are checked; the first token that finishes ``req`` ends the
        commit (the rest are dropped, its KV released). Then ``req`` streams its progress (every
        ``stream_interval`` tokens). A failure here fails ``req`` only. ``logprobs`` / ``top_logprobs``:
        one entry per token (None: not wanted). ``verified``: the tokens come from a speculative verify;
        each counts in ``req.spec_committed_tokens`` before it is appended, so the final output of a
        finishing token carries the count. Returns the number of tokens appended."""
        before = len(req.output_ids)
        now = time.perf_counter()
        try:
            for i, tok in enumerate(tokens):
                if req.is_finished:
                    break
                if verified:
                    req.spec_committed_tokens += 1
                self._append_token(req, tok, None if logprobs is None else logprobs[i],
                                   None if top_logprobs is None else top_logprobs[i], now)
        except Exception as e:  # noqa: BLE001 - fail this request only
            self.fail_request(req, e, "token bookkeeping and stop checking")
        self._emit_progress(req)
        return len(req.output_ids) - before

    def decode_step_done(self) -> None:
        """The running requests advanced (a decode step, a speculative round): the reserve kept for their
        future tokens decays toward ``min_new_token_ratio`` (SGLang's new_token_ratio_decay)."""
        self.new_token_ratio = max(
            self.config.min_new_token_ratio, self.new_token_ratio - self.config.new_token_ratio_decay
        )

    # ---- integrity and cache --------------------------------------------------------------------
    def check_integrity(self) -> None:
        idle = not (self.running or self.chunked_req)
        self.kv.check_integrity(self.live_reqs, idle=idle)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are in flight."""
        if self.has_work:
            return False
        if self.kv.tree is not None:
            self.kv.tree.evict_all()
            self.kv.tree.reset()
        self.check_integrity()
        return True

    # ---- inbox ------------------------------------------------------------------
    def process_inbox(self) -> None:
        """Apply queued submissions and aborts (``step`` does first; the engine calls it directly to apply
        an abort without running a forward). Same thread as ``step``."""
        while True:
            try:
                kind, arg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                arg.state = ReqState.WAITING
                if self.spec is not None and arg.spec_verify_ct is None:
                    arg.spec_verify_ct = 0
                self.waiting.append(arg)
                if self.unhealthy is not None:
                    self.refuse_unhealthy(arg)
            else:
                self._abort(arg)

    def _abort(self, rid: str | None) -> None:
        for req in [r for r in self.waiting if rid is None or r.rid == rid]:
            self.waiting.remove(req)
            self._finish(req, FinishReason("abort", message="aborted by request"))
        for req in [r for r in self.live_reqs if rid is None or r.rid == rid]:
            if req is self.chunked_req:
                self.chunked_req = None
            else:
                self.running.remove(req)
            self.kv.release(req)
            self._finish(req, FinishReason("abort", message="aborted by request"))

    # ---- scheduling -----------------------------------------------------------------
    def _remaining_new_tokens(self, req: Req) -> int:
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return max(0, min(left, self.config.max_req_len - req.seq_len))

    def _reserve(self, reqs: Sequence[Req]) -> int:
        """KV slots kept back for the future decode tokens of ``reqs`` (SGLang's new_token_ratio)."""
        return math.ceil(sum(self._remaining_new_tokens(r) for r in reqs) * self.new_token_ratio)

    def _swa_reserve(self, reqs: Sequence[Req]) -> int:
        """Sliding-window slots kept back for ``reqs`` (hybrid pool): under pressure a decoding request holds
        its window and one new token, so its future tokens need no more than that."""
        cap = self.kv.window
        return math.ceil(sum(min(self._remaining_new_tokens(r), cap) for r in reqs) * self.new_token_ratio)

    def _schedule(self) -> ScheduleBatch | None:
        """The next batch. With speculation, prefill batches carry no decode rows (mixed chunked
        prefill is off) and running requests advance by a draft + verify round (``_SPEC_ROUND``)
        whenever no prefill is scheduled."""
        if self.spec is None:
            return self._schedule_batch(decode=True)
        batch = self._schedule_batch(decode=False)
        if batch is None and self.running:
            return _SPEC_ROUND
        return batch

    def _schedule_batch(self, decode: bool) -> ScheduleBatch | None:
        self._cached_this_step = 0
        self.kv.new_batch()
        items: list[BatchItem] = []
        # Decode: one slot per running request (retracting the newest while they do not fit).
        for req in self.make_room_for_decode() if decode else ():
            start = req.kv_len
            rows = req.logits_rows(start, 1)
            items.append(BatchItem(req, start, 1, self.kv.extend(req, 1), rows))
        budget = self.config.prefill_budget
        chunking = self.config.chunked_prefill_size > 0
        if self.chunked_req is not None:
            req = self.chunked_req
            n = min(req.seq_len - req.kv_len, budget, self.kv.available())
            if n > 0:
                items.append(self._extend_item(req, n))
                budget -= n
                if req.kv_len == req.seq_len:
                    self.chunked_req = None
            if self.chunked_req is not None:
                return ScheduleBatch(items) if items else None
        self._sort_waiting()
        admitted: list[Req] = []
        while self.waiting and budget > 0:
            if len(self.running) + len(admitted) >= self.config.max_running_requests:
                break
            req = self.waiting[0]
            first = not items
            if not self.kv.admit(req):
                break
            extend = req.seq_len - req.kv_len
            n = min(extend, budget) if chunking else extend
            if chunking and self.kv.hybrid:
                n = min(n, self.kv.swa_available())  # a chunk as large as the sliding-window pool holds
            if n <= 0 or (not chunking and n > budget and not first):
                self.kv.release(req)
                break
            others = self.running + admitted + [req]
            if not self.kv.fits(n, self._reserve(others), self._swa_reserve(others) if self.kv.hybrid else 0) and not (
                first and self.kv.fits(n, 0, 0)
            ):
                self.kv.release(req)
                break
            self.waiting.popleft()
            req.state = ReqState.RUNNING
            if not req.admitted_once:
                req.cached_tokens, req.admitted_once = req.prefix_len, True
            self._cached_this_step += req.prefix_len
            items.append(self._extend_item(req, n))
            admitted.append(req)
            budget -= n
            if req.kv_len < req.seq_len:
                self.chunked_req = req
                break
        return ScheduleBatch(items) if items else None

    def _extend_item(self, req: Req, n: int) -> BatchItem:
        start = req.kv_len
        rows = req.logits_rows(start, n)
        slots = self.kv.extend(req, n)
        assert slots is not None, "scheduler admitted more tokens than the KV pool holds"
        return BatchItem(req, start, n, slots, rows)

    def _sort_waiting(self) -> None:
        if self.config.schedule_policy == "lpm" and self.kv.tree is not None and len(self.waiting) > 1:
            self.waiting = deque(sorted(self.waiting, key=lambda r: -self.kv.match(r)))

    # ---- results ----------------------------------------------------------------------
    def _process(self, batch: ScheduleBatch, logits: torch.Tensor) -> None:
        """logits: [R, V] float32, rows in batch order (``logits_rows`` of each item)."""
        offset = 0
        to_sample: list[BatchItem] = []
        last_rows: list[int] = []
        for it in batch.items:
            k = len(it.logits_rows)
            try:
                self._prompt_logprobs(it, logits[offset : offset + k])
            except Exception as e:  # noqa: BLE001 - fail this request only
                self.fail_request(it.req, e, "prompt logprob assembly")
            if it.samples and not it.req.is_finished:
                to_sample.append(it)
                last_rows.append(offset + k - 1)
            offset += k
        if any(it.is_decode_step for it in batch.items):
            self.decode_step_done()
        if to_sample:
            masks = self.grammar_masks([it.req for it in to_sample])
            rows = [
                SampleRow(
                    params=it.req.sampling_params, prompt_ids=it.req.origin_input_ids, output_ids=it.req.output_ids,
                    generator=it.req.generator, return_logprob=it.req.return_logprob,
                    top_logprobs_num=it.req.top_logprobs_num, token_bitmask=mask,
                )
                for it, mask in zip(to_sample, masks)
            ]
            picked = self.sample_isolated(sample, logits[last_rows], rows, [it.req for it in to_sample],
                                          self.config.eos_token_ids)
            for it, res in zip(to_sample, picked):
                if res is not None and not it.req.is_finished:
                    self.commit(it.req, [res[0]], [res[1]], [res[2]])
        for it in batch.items:  # requests that finished their prefill join the running ones
            r = it.req
            if it.samples and not r.is_finished and r not in self.running:
                self.running.append(r)

    def grammar_masks(self, reqs: Sequence[Req]) -> list[torch.Tensor | None]:
        """Each constrained request's allowed next tokens (a bitmask row, ``impl/constrained``), None for the
        others; a request whose matcher fails is failed here, alone."""
        masks: list[torch.Tensor | None] = [None] * len(reqs)
        idx = [j for j, r in enumerate(reqs) if r.grammar is not None and not r.is_finished]
        if not idx:
            return masks
        bitmask = allocate_bitmask(len(idx), max(reqs[j].grammar.vocab_size for j in idx))
        for k, j in enumerate(idx):
            try:
                reqs[j].grammar.fill(bitmask, k)
                masks[j] = bitmask[k]
            except Exception as e:  # noqa: BLE001 - fail this request only
                self.fail_request(reqs[j], e, "grammar mask")
        return masks

    def _emit_progress(self, req: Req) -> None:
        """Stream progress: an unfinished request with ``stream_interval`` new tokens since its last emit."""
        if not req.is_finished and req.on_output is not None:
            if len(req.output_ids) - req.last_emitted_len >= self.config.stream_interval:
                req.last_emitted_len = len(req.output_ids)
                self.emit(req)

    def _prompt_logprobs(self, it: BatchItem, rows: torch.Tensor) -> None:
        req = it.req
        want = [(j, it.start + o) for j, o in enumerate(it.logits_rows) if req.input_logprob_next_pos <= it.start + o
                < len(req.origin_input_ids) - 1]
        if not want:
            return
        lp = torch.log_softmax(rows[[j for j, _ in want]].float(), dim=-1)  # [w, V]
        for i, (_, p) in enumerate(want):
            tok = req.origin_input_ids[p + 1]
            req.input_token_logprobs.append((float(lp[i, tok]), tok))
            if req.top_logprobs_num > 0:
                v, idx = torch.topk(lp[i], min(req.top_logprobs_num, lp.shape[-1]))
                req.input_top_logprobs.append(list(zip(v.tolist(), idx.tolist())))
            else:
                req.input_top_logprobs.append(None)
            req.input_logprob_next_pos = p + 1

    def _append_token(self, req: Req, tok: int, logprob, top, now: float) -> None:
        sp = req.sampling_params
        if sp.max_new_tokens == 0:  # prefill only (e.g. prompt logprobs): nothing is generated
            self._release_and_finish(req, FinishReason("length", length=0))
            return
        req.append_output(tok)
        if req.first_token_time is None:
            req.first_token_time = now
        if req.return_logprob:
            req.output_token_logprobs.append((logprob, tok))
            req.output_top_logprobs.append(top)
        if sp.stop:  # this thread owns the detokenizer of a request with stop strings
            req.detok.step((tok,))
        if req.grammar is not None and not req.grammar.accept(tok):
            raise ValueError(f"token {tok} is not allowed by the request's {req.grammar.key.kind} grammar")
        reason = self._check_finished(req, tok)
        if reason is not None:
            self._release_and_finish(req, reason)

    def _check_finished(self, req: Req, tok: int) -> FinishReason | None:
        sp = req.sampling_params
        n = len(req.output_ids)
        if req.grammar is not None and req.grammar.is_terminated:  # the grammar completed with a stop token
            return FinishReason("stop", matched=tok)
        if n >= sp.max_new_tokens:
            return FinishReason("length", length=sp.max_new_tokens)
        if n >= sp.min_new_tokens:
            if tok in sp.stop_token_ids or (not sp.ignore_eos and tok in self.config.eos_token_ids):
                return FinishReason("stop", matched=tok)
        if req.seq_len >= self.config.max_req_len:
            return FinishReason("length", length=n)
        if sp.stop and n >= sp.min_new_tokens:
            # only the new text plus the longest stop string's tail can hold a new match
            text = req.detok.text
            lo = max(0, req.stop_checked_chars - max(len(s) for s in sp.stop) + 1)
            hits = [(pos, s) for s in sp.stop if (pos := text.find(s, lo)) >= 0]
            req.stop_checked_chars = len(text)
            if hits:
                pos, s = min(hits)
                req.stop_text_pos = pos
                return FinishReason("stop", matched=s)
        return None

    def _release_and_finish(self, req: Req, reason: FinishReason) -> None:
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.running:
            self.running.remove(req)
        self.kv.release(req)
        self._finish(req, reason)

    def _finish(self, req: Req, reason: FinishReason) -> None:
        req.finished_reason = reason
        req.state = ReqState.FINISHED
        req.finished_time = time.perf_counter()
        self.emit(req)
