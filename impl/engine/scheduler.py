"""Scheduler: waiting / running queues and one forward per ``step()``.

Each step composes the units that do the work, in this order:

1. intake (``inbox.py``): take new requests and aborts, on this thread;
2. decode and retraction (``decode_schedule.py``): one new token for every running request, retracting the
   newest while the KV pool cannot hold that;
3. admission and prefill chunking (``schedule_policy.py``): the chunked request's next chunk, then waiting
   requests while the prefill and KV budgets admit them;
4. the forward: prefill chunks and decode steps in one mixed forward, fault-isolated (``fault_isolation.py``);
5. results (``output_processor.py``): prompt logprobs, sampling, the per-token path, streaming.

The units share the request queues (``req_queues.py``) and the requests' KV (``kv_lifecycle.py``).

Speculative decoding plugs in as a decode worker (``impl/engine/speculative/base.py``): when no prefill is
scheduled it advances the running requests in rounds (``SpeculativeRound``) through this class's public seam
(``make_room_for_decode``, ``run_forward`` / ``run_isolated``, ``commit``, ``decode_step_done``), the same
units the one-token decode path uses.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import torch

from impl.engine.decode_schedule import DecodeSchedule
from impl.engine.fault_isolation import FaultIsolation
from impl.engine.inbox import AbortRequest, AddRequest, Inbox
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.output_processor import OutputProcessor
from impl.engine.req import FinishReason, Req, ReqState
from impl.engine.req_queues import ReqQueues
from impl.engine.schedule_batch import ScheduleBatch, SpeculativeRound
from impl.engine.schedule_policy import SchedulePolicy
from impl.engine.scheduler_config import DecodeStepTimes, SchedulerConfig
from impl.forward_batch import ForwardBatch
from impl.model.outputs import LogitsOutput

if TYPE_CHECKING:
    from impl.engine.speculative.base import DecodeWorker

T = TypeVar("T")


class Scheduler:
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
        self.queues = ReqQueues()
        self.inbox = Inbox()
        self.faults = FaultIsolation(self.queues, kv)
        self.decode = DecodeSchedule(config, self.queues, kv)
        self.policy = SchedulePolicy(config, self.queues, kv)
        self.output = OutputProcessor(config, self.queues, kv, self.faults)
        self.num_forwards = 0
        self.decode_times = DecodeStepTimes()
        self._idle_checked = False

    # ---- thread-safe entry points ---------------------------------------------
    def add_request(self, req: Req) -> None:
        if req.sampling_params.stop and req.detok is None:
            raise ValueError(f"request {req.rid} has stop strings but no detokenizer (Engine.submit sets req.detok)")
        self.inbox.put(AddRequest(req))

    def abort_request(self, rid: str | None) -> None:
        """Abort one request by id (None: all)."""
        self.inbox.put(AbortRequest(rid))

    # ---- state, read by the engine (its load, its health) ---------------------------------
    @property
    def waiting(self) -> deque[Req]:
        return self.queues.waiting

    @property
    def running(self) -> list[Req]:
        return self.queues.running

    @property
    def chunked_req(self) -> Req | None:
        return self.queues.chunked_req

    @property
    def live_reqs(self) -> list[Req]:
        return self.queues.live

    @property
    def has_work(self) -> bool:
        return self.queues.busy or not self.inbox.empty()

    @property
    def num_retractions(self) -> int:
        return self.decode.num_retractions

    @property
    def unhealthy(self) -> str | None:
        return self.faults.unhealthy

    # ---- the loop ---------------------------------------------------------------
    def step(self) -> bool:
        """Run at most one forward. Returns False when there was nothing to do."""
        t_start = time.perf_counter()
        self.process_inbox()
        if self.unhealthy is not None:
            return False
        plan = self._schedule()
        if plan is None:
            # Once per transition to idle (the background loop polls while idle).
            if self.config.check_integrity_when_idle and not self.has_work and not self._idle_checked:
                self._idle_checked = True
                self.faults.check_integrity_or_mark("when the engine went idle")
            return False
        self._idle_checked = False
        if isinstance(plan, SpeculativeRound):
            assert self.spec is not None
            self.spec.run_round(self)
            return True
        fb = plan.to_forward_batch(self.device)
        fb.work = plan.work_counters()
        t_fwd = time.perf_counter()
        out = self.run_forward(fb, [it.req for it in plan.items])
        t_fwd = time.perf_counter() - t_fwd
        if out is None:
            return True
        if self.spec is not None:
            assert out.hidden_states is not None, "the target's forward returns its final-normed hidden rows"
            self.spec.after_forward(plan, out.hidden_states)
        if plan.has_decode:
            self.decode_step_done()
        self.output.process(plan, out.logits)
        if plan.is_pure_decode:
            self.decode_times.add(len(plan.items), time.perf_counter() - t_start, t_fwd)
        return True

    def _schedule(self) -> ScheduleBatch | SpeculativeRound | None:
        """The next batch. With speculation, prefill batches carry no decode rows (mixed chunked
        prefill is off) and running requests advance by a draft + verify round whenever no prefill
        is scheduled."""
        if self.spec is None:
            return self._schedule_batch(decode=True)
        batch = self._schedule_batch(decode=False)
        if batch is None and self.running:
            return SpeculativeRound()
        return batch

    def _schedule_batch(self, decode: bool) -> ScheduleBatch | None:
        self.kv.new_batch()
        items = self.decode.items() if decode else []
        cached = self.policy.add_prefill(items, self.decode.new_token_ratio)
        return ScheduleBatch(items, cached_tokens=cached) if items else None

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

    def run_isolated(self, reqs: Sequence[Req], fn: Callable[[], T]) -> T | None:
        return self.faults.run_isolated(reqs, fn)

    def make_room_for_decode(self) -> list[Req]:
        return self.decode.make_room()

    def retract(self, req: Req) -> None:
        self.decode.retract(req)

    def commit(self, req: Req, tokens: Sequence[int], logprobs: Sequence[float | None] | None = None,
               top_logprobs: Sequence[Any] | None = None, *, verified: bool = False) -> int:
        return self.output.commit(req, tokens, logprobs, top_logprobs, verified=verified)

    def decode_step_done(self) -> None:
        self.decode.step_done()

    def fail_request(self, req: Req, exc: BaseException | None, stage: str) -> None:
        self.faults.fail_request(req, exc, stage)

    # ---- control: integrity, cache, failures (the engine's calls) ---------------------------------
    def check_integrity(self) -> None:
        self.faults.check_integrity()

    def recover_from_step_failure(self, exc: BaseException, consecutive: int) -> None:
        self.faults.recover_from_step_failure(exc, consecutive)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are in flight."""
        if self.has_work:
            return False
        self.kv.flush()
        self.check_integrity()
        return True

    # ---- inbox ------------------------------------------------------------------
    def process_inbox(self) -> None:
        """Apply queued submissions and aborts (``step`` does first; the engine calls it directly to apply
        an abort without running a forward). Same thread as ``step``."""
        for msg in self.inbox.drain():
            if isinstance(msg, AddRequest):
                self._take(msg.req)
            else:
                self._abort(msg.rid)

    def _take(self, req: Req) -> None:
        req.state = ReqState.WAITING
        if self.spec is not None and req.spec_verify_ct is None:
            req.spec_verify_ct = 0
        self.queues.waiting.append(req)
        if self.unhealthy is not None:
            self.faults.refuse_unhealthy(req)

    def _abort(self, rid: str | None) -> None:
        for req in [r for r in self.queues.waiting if rid is None or r.rid == rid]:
            self.queues.remove(req)
            self.faults.finish(req, FinishReason("abort", message="aborted by request"))
        for req in [r for r in self.queues.live if rid is None or r.rid == rid]:
            self.queues.remove(req)
            self.kv.release(req)
            self.faults.finish(req, FinishReason("abort", message="aborted by request"))
