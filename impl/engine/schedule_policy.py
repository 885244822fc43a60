"""Admission and prefill chunking: which waiting requests a forward prefills, and how many tokens of each.

First the in-progress chunked request continues; then waiting requests are taken in order (``fcfs``, or
longest cached prefix first with ``lpm``) while the prefill budget lasts and the KV budget (free plus
evictable slots, less a reserve for the future tokens of the running and admitted requests) admits them.

Chunked prefill (SGLang's ``--chunked-prefill-size``): at most that many prefill tokens per forward; a longer
prompt is split into chunks, one chunked request at a time, and its partial chunks are not sampled. ``-1``
disables chunking (a prompt is prefilled whole; ``--max-prefill-tokens`` then bounds a batch but never blocks
the first request).
"""

from __future__ import annotations

from collections import deque

from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import Req, ReqState
from impl.engine.req_queues import ReqQueues
from impl.engine.schedule_batch import BatchItem
from impl.engine.scheduler_config import SchedulerConfig


class SchedulePolicy:
    def __init__(self, config: SchedulerConfig, queues: ReqQueues, kv: KVLifecycle):
        self.config = config
        self.queues = queues
        self.kv = kv

    def add_prefill(self, items: list[BatchItem], new_token_ratio: float) -> int:
        """Append this forward's prefill rows to ``items`` (which hold its decode rows, if any); returns the
        cached prefix tokens the newly admitted requests reuse."""
        q = self.queues
        budget = self.config.prefill_budget
        if q.chunked_req is not None:
            req = q.chunked_req
            n = min(req.seq_len - req.kv_len, budget, self.kv.available())
            if n > 0:
                items.append(self._extend_item(req, n))
                budget -= n
                if req.kv_len == req.seq_len:  # its last chunk: in flight until the forward's output
                    q.chunked_req = None
                    q.prefilling.append(req)
            if q.chunked_req is not None:  # one chunked request at a time
                return 0
        self._sort_waiting()
        admitted: list[Req] = []
        cached = 0
        while q.waiting and budget > 0 and len(q.running) + len(admitted) < self.config.max_running_requests:
            req = q.waiting[0]
            size = self._admit(req, budget, first=not items, others=q.running + admitted, ratio=new_token_ratio)
            if size is None:
                break
            n = size
            q.waiting.popleft()
            req.state = ReqState.RUNNING
            if not req.admitted_once:
                req.cached_tokens, req.admitted_once = req.prefix_len, True
            cached += req.prefix_len
            items.append(self._extend_item(req, n))
            admitted.append(req)
            budget -= n
            if req.kv_len < req.seq_len:
                q.chunked_req = req
                break
            q.prefilling.append(req)
        return cached

    def _admit(self, req: Req, budget: int, first: bool, others: list[Req], ratio: float) -> int | None:
        """Lock ``req``'s cached prefix and size its first chunk (the tokens this forward prefills); None, with
        nothing held, when it does not fit. The first request of a batch is admitted without the reserve."""
        if not self.kv.admit(req):
            return None
        chunking = self.config.chunking
        extend = req.seq_len - req.kv_len
        n = self.kv.max_chunk(min(extend, budget)) if chunking else extend
        if n <= 0 or (not chunking and n > budget and not first):
            self.kv.release(req)
            return None
        future = [self.remaining_new_tokens(r) for r in others + [req]]
        if not self.kv.fits(n, future, ratio) and not (first and self.kv.fits(n, [], ratio)):
            self.kv.release(req)
            return None
        return n

    def remaining_new_tokens(self, req: Req) -> int:
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return max(0, min(left, self.config.max_req_len - req.seq_len))

    def _extend_item(self, req: Req, n: int) -> BatchItem:
        start = req.kv_len
        rows = req.logits_rows(start, n)
        slots = self.kv.extend(req, n)
        assert slots is not None, "scheduler admitted more tokens than the KV pool holds"
        return BatchItem(req, start, n, slots, rows)

    def _sort_waiting(self) -> None:
        """``lpm``: longest cached prefix first (stable: without a prefix cache every match is 0, order kept)."""
        q = self.queues
        if self.config.schedule_policy == "lpm" and len(q.waiting) > 1:
            q.waiting = deque(sorted(q.waiting, key=lambda r: -self.kv.match(r)))
