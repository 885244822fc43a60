"""SGLang's ``/start_profile`` and ``/stop_profile``: a torch profiler trace of the scheduler's steps.

``start`` queues a ``ProfileRequest``; the thread that runs the scheduler's steps starts the profiler at its next
step boundary (torch's profiler records the ops of the thread that started it and of the OpenMP teams that thread
launches, so it has to be that thread), once the model has run ``start_step`` forwards if one was given. The trace
ends at ``stop`` (which waits until it is written) or by itself after ``num_steps`` forwards (at most
``MAX_PROFILE_FORWARDS``: a trace is held in memory until written). It
is written with torch's ``export_chrome_trace`` as SGLang names its files:
``<output_dir>/[<prefix>-]<profile_id>-TP-0[-DP-<rank>].trace.json.gz`` (gzip'd Chrome trace JSON: Perfetto and
chrome://tracing open it). Exporting runs on the scheduler's thread: steps wait for it, as in SGLang.

Invariants: at most one request is queued or profiling at a time; the profiler is started and stopped only by
``tick``, on the stepping thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

logger = logging.getLogger("impl.engine")


# A trace holds every op's event in memory until it is written: one left running (no num_steps, no stop) ends by
# itself after this many forwards, as if num_steps had said so (tens of thousands of events a forward at full size).
MAX_PROFILE_FORWARDS = 10_000


class ProfilerStateError(ValueError):
    """A start while a profile is queued or running, or a stop with none (the HTTP layer's 400)."""


@dataclass(frozen=True)
class ProfileRequest:
    output_dir: str  # absolute; created when the trace is written
    profile_id: str
    prefix: str = ""
    dp_rank: int | None = None  # a --dp-size replica's rank, in the file name
    start_step: int | None = None  # begin once the model has run this many forwards since startup
    num_steps: int | None = None  # stop by itself after this many forwards
    with_stack: bool = True
    record_shapes: bool = True
    profile_memory: bool = False  # "MEM": the profiler's memory events in the same trace
    cuda: bool = False  # "GPU" on a CUDA engine

    @property
    def path(self) -> str:
        name = "-".join(p for p in (self.prefix, self.profile_id, "TP-0") if p)
        if self.dp_rank is not None:
            name += f"-DP-{self.dp_rank}"
        return os.path.join(self.output_dir, name + ".trace.json.gz")


class StepProfiler:
    """One engine's profiler; ``forwards`` reads how many model forwards have run (the step counter)."""

    def __init__(self, forwards: Callable[[], int]):
        self._forwards = forwards
        self._cond = threading.Condition()
        self._queued: ProfileRequest | None = None
        self._running: tuple[ProfileRequest, Any, int] | None = None  # request, torch profiler, forwards at start
        self._stop_wanted = False
        self._result: tuple[bool, str] | None = None  # the last stop's (success, trace path or why none)
        self._last: str | None = None  # what the last profile did, for a stop with none in progress

    @property
    def active(self) -> bool:
        with self._cond:
            return self._queued is not None or self._running is not None

    def start(self, req: ProfileRequest) -> None:
        with self._cond:
            if self._queued is not None or self._running is not None:
                raise ProfilerStateError("Profiling is already in progress; call /stop_profile first")
            self._queued, self._stop_wanted, self._result = req, False, None

    def stop(self, timeout: float, pump: Callable[[], None]) -> tuple[bool, str]:
        """End the trace and wait (up to ``timeout`` seconds) until it is written; ``pump`` gets the stepping
        thread to a step boundary (a loopless engine runs ``tick`` in it). (True, the trace's path), or (False,
        why there is none)."""
        with self._cond:
            if self._queued is None and self._running is None:
                last = f" ({self._last})" if self._last else ""
                raise ProfilerStateError(f"Profiling is not in progress{last}; call /start_profile first")
            self._stop_wanted = True
        pump()
        with self._cond:
            self._cond.wait_for(lambda: self._result is not None, timeout)
            if self._result is None:
                raise TimeoutError(f"the scheduler reached no step boundary within {timeout:g} s to stop the profiler")
            return self._result

    def tick(self) -> None:
        """At a step boundary, on the stepping thread: start a queued profile, stop a running one when asked or
        when its ``num_steps`` forwards have run."""
        if self._queued is None and self._running is None:  # every step's path: no lock (set only under it)
            return
        with self._cond:
            if self._queued is None and self._running is None:
                return
            done, queued = self._forwards(), self._queued
            if self._running is not None:
                req, prof, first = self._running
                if self._stop_wanted or done - first >= (req.num_steps or MAX_PROFILE_FORWARDS):
                    self._running = None
                    self._finish(req, prof, done - first)
            elif queued is not None and self._stop_wanted:
                self._queued = None
                self._last = (f"profile {queued.profile_id} was stopped before start_step {queued.start_step} was "
                              "reached; no trace was written")
                self._result = (False, self._last)
            elif queued is not None and (queued.start_step is None or done >= queued.start_step):
                self._queued = None
                self._running = (queued, self._begin(queued), done)
            self._cond.notify_all()

    def _begin(self, req: ProfileRequest) -> Any:
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if req.cuda else [])
        prof = torch.profiler.profile(activities=acts, with_stack=req.with_stack, record_shapes=req.record_shapes,
                                      profile_memory=req.profile_memory)
        prof.start()
        logger.info("Profiling starts (profile id %s); the trace will be saved to %s", req.profile_id, req.path)
        return prof

    def _finish(self, req: ProfileRequest, prof: Any, steps: int) -> None:
        t = time.perf_counter()
        prof.stop()
        try:
            os.makedirs(req.output_dir, exist_ok=True)
            prof.export_chrome_trace(req.path)
        except OSError as e:
            self._last = f"profile {req.profile_id}: the trace could not be written to {req.path} ({e})"
            logger.error("%s", self._last)
            self._result = (False, self._last)
            return
        self._last = f"profile {req.profile_id} ended after {steps} forward(s): {req.path}"
        logger.info("Profiling done after %d forward(s), trace written in %.1f s: %s", steps,
                    time.perf_counter() - t, req.path)
        self._result = (True, req.path)
