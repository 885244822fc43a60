"""The seam between the scheduler and a decode worker (speculative decoding).

A decode worker replaces the scheduler's one-token decode step: when no prefill
is scheduled, the scheduler hands its running requests to the worker's
``run_round`` (one draft + verify round for FROZEN_KV_MTP), and after every
prefill forward it passes the batch's final hidden states to ``after_forward``
(the seeds of the next round).

``DecodeWorker``: what a worker implements. ``SchedulerSeam``: everything a worker
may use of the scheduler (``impl/engine/scheduler.py`` implements it); a worker
touches no other scheduler state and never calls the model runner itself, so
every forward it runs is fault-isolated (a failing forward fails that batch's
requests only: an error final output each, their KV freed) and every token it
produces takes the scheduler's own per-token path (stop checks, logprobs,
streaming).

Invariants a worker keeps:
* it runs only the requests ``make_room_for_decode`` returned, and only after that
  call in the same round (their KV may have been retracted otherwise);
* a request's KV grows through ``kv.extend`` and shrinks through ``kv.trim``
  (rejected rows), and every token it keeps goes through ``commit``;
* after ``run_forward`` / ``run_isolated`` returned None, the requests it named are
  finished: the worker drops them for the rest of the round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeVar

import torch

from impl.engine.req import Req
from impl.forward_batch import ForwardBatch
from impl.model.outputs import LogitsOutput

if TYPE_CHECKING:
    from impl.engine.kv_lifecycle import KVLifecycle
    from impl.engine.schedule_batch import ScheduleBatch
    from impl.engine.scheduler_config import SchedulerConfig

T = TypeVar("T")


class SchedulerSeam(Protocol):
    """What a decode worker may call on the scheduler (all on the scheduler thread)."""

    @property
    def config(self) -> "SchedulerConfig":
        """Read only: ``max_req_len``, ``eos_token_ids``."""
        ...

    @property
    def kv(self) -> "KVLifecycle":
        """The requests' KV: ``available``, ``extend``, ``trim`` for the requests of the round."""
        ...

    @property
    def device(self) -> torch.device:
        """Where batches go (``pack_forward_batch``)."""
        ...

    def make_room_for_decode(self) -> list[Req]:
        """Retract the newest requests while the KV pool cannot give every running request one more
        slot; the running requests that remain, oldest first."""
        ...

    def run_forward(self, fb: ForwardBatch, reqs: Sequence[Req]) -> LogitsOutput | None:
        """The target model's forward of ``fb`` (whose rows are ``reqs``'), fault-isolated: None when it
        failed, and then ``reqs`` are failed (one error final output each, KV freed)."""
        ...

    def run_isolated(self, reqs: Sequence[Req], fn: Callable[[], T]) -> T | None:
        """``fn()``, another forward over ``reqs`` (a draft), fault-isolated as ``run_forward``."""
        ...

    def commit(self, req: Req, tokens: Sequence[int], logprobs: Sequence[float | None] | None = None,
               top_logprobs: Sequence[Any] | None = None, *, verified: bool = False) -> int:
        """Append ``tokens`` to ``req`` through the per-token path, up to the first that finishes it, then
        stream its progress; returns how many were appended."""
        ...

    def decode_step_done(self) -> None:
        """A round advanced the running requests: the KV reserve ratio decays as after a decode step."""
        ...

    def fail_request(self, req: Req, exc: BaseException | None, stage: str) -> None:
        """Stop ``req`` alone with an error final output (its KV freed): a failure of its own (its grammar)."""
        ...


class DecodeWorker(Protocol):
    """What a decode worker implements (``FrozenKVMTPWorker``)."""

    stats: Any  # .as_dict(), .avg_accept_length (``/get_server_info``, ``/metrics``)

    def describe(self) -> str:
        """The startup log line."""
        ...

    def server_info(self) -> dict:
        """``/get_server_info``'s ``speculative``."""
        ...

    def after_forward(self, batch: "ScheduleBatch", hidden: torch.Tensor) -> None:
        """After a prefill forward: ``hidden`` [R, backbone], the final-normed rows of ``batch``'s logits rows."""
        ...

    def run_round(self, sched: SchedulerSeam) -> None:
        """Advance every running request by at least one token (or fail it), through ``sched`` only."""
        ...
