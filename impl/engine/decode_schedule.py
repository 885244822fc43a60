"""Decode rows and retraction: one new KV slot per running request each step, the newest preempted while the
pool cannot give every one of them a slot.

Preemption (retraction): the request's computed KV goes to the radix cache (or back to the allocator), it
keeps its output tokens, prompt logprobs and random generator, and re-enters the front of the waiting queue;
its re-prefill covers prompt plus output, so its tokens stay the same.

Also the new-token ratio (SGLang's ``new_token_ratio``): the share of the running requests' future tokens
that admission keeps KV for. A retraction resets it to ``init_new_token_ratio`` (the reserve was too small);
every decode step or speculative round lets it decay toward ``min_new_token_ratio``.
"""

from __future__ import annotations

import logging

from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import Req, ReqState
from impl.engine.req_queues import ReqQueues
from impl.engine.schedule_batch import BatchItem
from impl.engine.scheduler_config import SchedulerConfig

logger = logging.getLogger("impl.engine")


class DecodeSchedule:
    def __init__(self, config: SchedulerConfig, queues: ReqQueues, kv: KVLifecycle):
        self.config = config
        self.queues = queues
        self.kv = kv
        self.new_token_ratio = config.init_new_token_ratio
        self.num_retractions = 0

    def items(self) -> list[BatchItem]:
        """One decode row per running request (after ``make_room``), in running order."""
        reqs = self.make_room()
        starts = [req.kv_len for req in reqs]
        slots = self.kv.extend_each(reqs)
        assert slots is not None, "make_room left every running request one slot"
        return [BatchItem(req, start, 1, s, req.logits_rows(start, 1)) for req, start, s in zip(reqs, starts, slots)]

    def make_room(self) -> list[Req]:
        """Every running request is about to add at least one token: retract the newest (the chunked
        request first) while the KV pool cannot give each one more slot. The running requests left."""
        q = self.queues
        while q.running and self.kv.available() < len(q.running):
            if q.chunked_req is not None:
                victim, q.chunked_req = q.chunked_req, None
            else:
                victim = q.running.pop()
            self.retract(victim)
        return list(q.running)

    def retract_all(self, why: str) -> int:
        """Retract every running request (the chunked one first, then the newest first, so the oldest ends at
        the front of the waiting queue); how many."""
        q = self.queues
        n = 0
        while q.running or q.chunked_req is not None:
            if q.chunked_req is not None:
                victim, q.chunked_req = q.chunked_req, None
            else:
                victim = q.running.pop()
            self.retract(victim, why)
            n += 1
        return n

    def retract(self, req: Req, why: str = "KV pool short") -> None:
        """Preempt ``req``: its KV goes to the cache (or the allocator) and it re-enters the front of the
        waiting queue, keeping its output (its re-prefill covers prompt plus output)."""
        self.kv.release(req)
        req.state = ReqState.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.queues.waiting.appendleft(req)
        self.new_token_ratio = self.config.init_new_token_ratio
        logger.info("retracted request %s (%s); it will be prefilled again", req.rid, why)

    def step_done(self) -> None:
        """The running requests advanced (a decode step, a speculative round): the reserve kept for their
        future tokens decays toward ``min_new_token_ratio`` (SGLang's new_token_ratio_decay)."""
        self.new_token_ratio = max(
            self.config.min_new_token_ratio, self.new_token_ratio - self.config.new_token_ratio_decay
        )
