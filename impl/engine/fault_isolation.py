"""Fault isolation for the scheduler: one failing request never takes the others down.

The promises (README, "What the server promises under faults"):

* A failure while handling **one request** (prompt-logprob assembly, sampling
  its row, stop checking, building or delivering its output) fails that
  request only: its KV slots are freed without being cached (``discard``), and
  it finishes with ``finish_reason`` ``{"type": "abort", "status_code": 500,
  "message": ...}``; every other request keeps running.
* Sampling runs batched; if the batch call raises, each row is sampled alone,
  so only the rows that fail on their own are failed.
* A failure of a **whole batch** (a forward pass: the scheduler's, a speculative
  draft or verify; ``run_isolated``) fails that batch's requests (500) and
  re-checks KV integrity once.
* A failed integrity check (after a batch failure, or when the engine goes
  idle) is logged once and makes the engine **unhealthy**: every request in
  flight and every later one finishes with ``status_code`` 503 and the reason,
  and ``unhealthy`` holds the reason for ``/health``, so an orchestrator
  restarts the server instead of it looping on a broken state.
* Every submitted request gets exactly one final output, whichever of these
  paths it takes (contract ``ENGINE-FAULT-ONE-FINAL``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence, TypeVar

from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import FinishReason, Req, ReqState
from impl.engine.req_queues import ReqQueues
from impl.sampling.sampling_params import SamplingError

logger = logging.getLogger("impl.engine")

# Scheduler-loop failures outside a forward (a scheduling bug): the 1st fails the live requests,
# the 2nd in a row also the waiting ones, the 3rd marks the engine unhealthy.
FAIL_WAITING_AFTER = 2
UNHEALTHY_AFTER = 3

T = TypeVar("T")


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class FaultIsolation:
    """The scheduler's failure handling over its queues and KV; also where every request gets its final output
    (``finish``), so the one-final-output promise has one home."""

    def __init__(self, queues: ReqQueues, kv: KVLifecycle):
        self.queues = queues
        self.kv = kv
        self.unhealthy: str | None = None  # set once by a failed integrity check

    def finish(self, req: Req, reason: FinishReason) -> None:
        """``req`` is done (finished, aborted or failed): its final output goes out."""
        req.finished_reason = reason
        req.state = ReqState.FINISHED
        req.finished_time = time.perf_counter()
        self.emit(req)

    def check_integrity(self) -> None:
        """KV ownership over the live requests (``KVLifecycle.check_integrity``); idle: no row or lock left."""
        q = self.queues
        self.kv.check_integrity(q.live, idle=not q.live)

    # ---- one request ----------------------------------------------------------------
    def fail_request(self, req: Req, exc: BaseException | None, stage: str, status: int = 500,
                     message: str | None = None) -> None:
        """Stop ``req`` with an error final output and free its KV; nothing else is touched."""
        if req.is_finished:
            return
        if isinstance(exc, SamplingError):  # the request's own fields leave it nothing to do: the client's error
            logger.warning("request %s stopped during %s: %s", req.rid, stage, exc)
            status, message = 400, f"{exc}; this request was stopped"
        elif exc is not None:
            logger.error("request %s failed during %s (%s); it is stopped, other requests continue", req.rid, stage,
                         describe(exc), exc_info=exc)
        if message is None:
            message = f"internal error during {stage}: {describe(exc) if exc else 'unknown'}; this request was stopped"
        self.queues.remove(req)
        try:
            self.kv.discard(req)
        except Exception as e:  # noqa: BLE001 - a broken KV state is caught by the integrity check
            logger.error("freeing the KV of failed request %s raised %s", req.rid, describe(e))
        self.finish(req, FinishReason("abort", message=message, status_code=status))

    def emit(self, req: Req) -> None:
        """Deliver ``req``'s output; if building it fails, fail the request (its final output still goes out)."""
        if req.on_output is None:
            return
        try:
            req.on_output(req)
        except Exception as e:  # noqa: BLE001 - isolate the request
            if req.is_finished:
                logger.error("the final output of request %s could not be delivered: %s", req.rid, describe(e),
                             exc_info=e)
            else:
                self.fail_request(req, e, "output assembly (detokenization)")

    def sample_isolated(self, sample: Callable[..., Any], logits, rows: Sequence[Any], reqs: Sequence[Req],
                        eos_ids) -> list[tuple[int, Any, Any] | None]:
        """(token, logprob, top) per row; None for a row whose request failed (and was failed here)."""
        try:
            out = sample(logits, rows, eos_ids)
            return [(out.token_ids[i], out.logprobs[i], out.top_logprobs[i]) for i in range(len(rows))]
        except Exception as batch_exc:  # noqa: BLE001 - find the rows at fault
            logger.warning("batched sampling failed (%s); sampling each row alone", describe(batch_exc))
        results: list[tuple[int, Any, Any] | None] = []
        for i, (row, req) in enumerate(zip(rows, reqs)):
            try:
                o = sample(logits[i : i + 1], [row], eos_ids)
                results.append((o.token_ids[0], o.logprobs[0], o.top_logprobs[0]))
            except Exception as e:  # noqa: BLE001 - isolate the request
                self.fail_request(req, e, "sampling")
                results.append(None)
        return results

    # ---- a batch, the loop, the engine ---------------------------------------------------
    def run_isolated(self, reqs: Sequence[Req], fn: Callable[[], T]) -> T | None:
        """``fn()``, a forward pass over the rows of ``reqs``; if it raises, ``fail_batch(reqs, exc)`` and None."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - fail this batch only
            self.fail_batch(reqs, e)
            return None

    def fail_batch(self, reqs: Sequence[Req], exc: BaseException) -> None:
        """The forward of a batch failed: fail its requests, then check KV integrity once."""
        logger.error("the forward pass of a batch of %d request(s) failed (%s); failing those requests", len(reqs),
                     describe(exc), exc_info=exc)
        msg = f"internal error: the forward pass of this request's batch failed ({describe(exc)}); retry the request"
        for r in dict.fromkeys(reqs):
            self.fail_request(r, None, "forward", message=msg)
        self.check_integrity_or_mark("after a failed batch")

    def recover_from_step_failure(self, exc: BaseException, consecutive: int) -> None:
        """A step raised outside the forward (a scheduling bug): fail what it may concern, escalate on repeats."""
        msg = f"internal error in the scheduler ({describe(exc)}); this request was stopped"
        for r in self.queues.live:
            self.fail_request(r, None, "scheduling", message=msg)
        if consecutive >= FAIL_WAITING_AFTER:
            for r in list(self.queues.waiting):
                self.fail_request(r, None, "scheduling", message=msg)
        if consecutive >= UNHEALTHY_AFTER:
            self.mark_unhealthy(f"the scheduler step failed {consecutive} times in a row: {describe(exc)}")
        else:
            self.check_integrity_or_mark("after a failed scheduler step")

    def check_integrity_or_mark(self, when: str) -> bool:
        try:
            self.check_integrity()
        except Exception as e:  # noqa: BLE001 - any failure means the KV state cannot be trusted
            self.mark_unhealthy(f"KV integrity check failed {when}: {describe(e)}")
            return False
        return True

    def mark_unhealthy(self, reason: str) -> None:
        """Logged once; every request in flight and every later one finishes with 503 and the reason."""
        if self.unhealthy is not None:
            return
        self.unhealthy = reason
        logger.error("engine unhealthy: %s; failing every request until the server is restarted", reason)
        q = self.queues
        for r in list(q.waiting) + q.live:
            self.refuse_unhealthy(r)

    def refuse_unhealthy(self, req: Req) -> None:
        self.fail_request(req, None, "scheduling", status=503,
                          message=f"the engine is unhealthy ({self.unhealthy}); restart the server")
