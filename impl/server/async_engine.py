"""AsyncEngine: the offline Engine seen from an asyncio event loop.

The engine's scheduler runs on its own thread (``Engine.start_background_loop``);
each request's output dicts arrive on a thread-safe ``RequestHandle.queue``.
This wrapper adds one thing: a wake-up of the event loop whenever the
scheduler thread emits output for a request, so a coroutine awaits its next
chunk without polling and without blocking the loop.

The wake-up wraps ``Req.on_output`` (a public field the engine sets in
``submit``). The scheduler may already have emitted output before the wrap
takes effect; ``RequestStream`` drains the queue before every wait, so
nothing is lost.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from impl.engine.engine import Engine, RequestHandle
from impl.engine.req import Req


LIVENESS_POLL_S = 1.0
logger = logging.getLogger("impl.server")


class EngineDeadError(RuntimeError):
    """The scheduler thread has stopped (it raised): pending requests will never finish."""


@dataclass
class RequestStream:
    """One submitted request, consumed from the event loop."""

    req: Req
    handle: RequestHandle
    alive: Callable[[], bool] = lambda: True
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    final: dict[str, Any] | None = None
    recorded: bool = False  # on_finish already called

    @property
    def rid(self) -> str:
        return self.req.rid

    async def outputs(self) -> AsyncIterator[dict[str, Any]]:
        """Each output dict as it arrives; the last has a finish_reason."""
        while self.final is None:
            self.wake.clear()
            got = False
            while True:
                try:
                    out = self.handle.queue.get_nowait()
                except queue.Empty:
                    break
                got = True
                if out["meta_info"]["finish_reason"] is not None:
                    self.final = out
                yield out
                if self.final is not None:
                    return
            if not got:
                try:
                    await asyncio.wait_for(self.wake.wait(), LIVENESS_POLL_S)
                except asyncio.TimeoutError:
                    if not self.alive():
                        raise EngineDeadError("the engine's scheduler thread has stopped (see the server log); "
                                              "restart the server") from None

    async def result(self) -> dict[str, Any]:
        async for _ in self.outputs():
            pass
        assert self.final is not None
        return self.final


class AsyncEngine:
    """Submit prepared Reqs from coroutines; the engine loop runs on its background thread."""

    def __init__(self, engine: Engine, on_finish: Callable[[Req], None] | None = None):
        self.engine = engine
        self.on_finish = on_finish  # called once per request, on the scheduler thread, when it finishes
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._live: set[str] = set()  # rids submitted and not finished (a duplicate live rid is refused)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.engine.start_background_loop()

    def submit(self, reqs: list[Req], stream: bool) -> list[RequestStream]:
        """Validate every request first (ValueError names the problem), then enqueue them all.

        A rid that is already live (submitted, not finished), or given twice in one call, is a ValueError
        (SGLang refuses duplicate rids too): aborts by rid would otherwise hit the wrong request.
        """
        for r in reqs:
            self.engine.scheduler.validate(r)
        rids = [r.rid for r in reqs]
        with self._lock:
            dup = sorted(x for x, c in collections.Counter(rids).items() if c > 1 or x in self._live)
            if dup:
                raise ValueError(f"'rid' {dup[0]!r} is already in use by a running request; rids must be unique "
                                 "among live requests (omit 'rid' to get a fresh one)")
            self._live.update(rids)
        streams = []
        try:
            for r in reqs:
                handle = self.engine.submit(r, stream)
                s = RequestStream(r, handle, self.alive)
                self._wrap(s)
                streams.append(s)
        except BaseException:
            for s in streams:
                self.engine.abort(s.rid)
            with self._lock:
                self._live.difference_update(r.rid for r in reqs[len(streams):])
            raise
        return streams

    def _wrap(self, s: RequestStream) -> None:
        loop = self.loop
        inner = s.req.on_output

        def on_output(req: Req) -> None:  # runs on the scheduler thread
            if req.is_finished:  # before the output is visible, so metrics already count it
                self._finished(s)
            if inner is not None:
                inner(req)
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(s.wake.set)

        s.req.on_output = on_output
        # output emitted before the wrap took effect is drained on the stream's first pass
        if s.req.is_finished:
            self._finished(s)

    def _finished(self, s: RequestStream) -> None:
        with self._lock:
            if s.recorded:
                return
            s.recorded = True
            self._live.discard(s.rid)
        if self.on_finish is not None:
            try:
                self.on_finish(s.req)
            except Exception:  # noqa: BLE001 - metrics / logging must never cost the client its answer
                logger.exception("recording finished request %s failed", s.rid)

    def alive(self) -> bool:
        """The scheduler thread runs."""
        return self.engine.is_alive()

    def abort(self, rid: str | None) -> None:
        self.engine.abort(rid)

    def shutdown(self) -> None:
        self.engine.shutdown()

    # ---- load, read from the event loop (plain reads of ints the scheduler thread updates) ----
    def num_running(self) -> int:
        sched = self.engine.scheduler
        return len(sched.running) + (1 if sched.chunked_req is not None else 0)

    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

    def kv_usage(self) -> float:
        """Fraction of KV slots neither free nor evictable (SGLang's token_usage)."""
        total = self.engine.runner.budget.num_tokens
        return max(0.0, 1.0 - self.engine.scheduler.kv.available() / total) if total else 0.0
