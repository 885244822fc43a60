"""AsyncEngine: the engine's one async API (the HTTP server's, and offline ``await`` use).

The engine's scheduler runs on its own thread (``Engine.start_background_loop``)
and its detokenizer stage on another; each request's ``ReqOutput`` objects
arrive on a thread-safe ``RequestHandle.queue``. This wrapper adds a wake-up of
the event loop whenever an output is queued (the handle's ``wake`` hook), so a
coroutine awaits its next output without polling and without blocking the loop.

* ``generate(...)``: ``Engine.generate``'s arguments and SGLang dicts, awaited
  (``stream=True``: an async iterator of cumulative dicts, several requests
  interleaved in arrival order).
* ``submit(reqs, stream)``: Reqs made by ``Engine.expand_requests`` (already
  validated) -> one ``RequestStream`` each, whose ``outputs()`` yields ``ReqOutput``.
* ``load()``: ``Engine.load()``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from impl.engine.engine import Engine
from impl.engine.load import LoadView
from impl.engine.output import ReqOutput, SGLangDicts, TokenText, sglang_dict
from impl.engine.req import Req
from impl.engine.request_handle import RequestHandle

LIVENESS_POLL_S = 1.0
logger = logging.getLogger("impl.server")


class EngineDeadError(RuntimeError):
    """The scheduler thread has stopped (it raised): pending requests will never finish."""


@dataclass
class RequestStream:
    """One submitted request, consumed from the event loop."""

    handle: RequestHandle
    alive: Callable[[], bool] = lambda: True
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    final: ReqOutput | None = None

    @property
    def req(self) -> Req:
        return self.handle.req

    @property
    def rid(self) -> str:
        return self.handle.rid

    async def outputs(self) -> AsyncIterator[ReqOutput]:
        """Each output as it arrives; the last is finished."""
        while self.final is None:
            self.wake.clear()
            got = False
            while True:
                try:
                    out = self.handle.queue.get_nowait()
                except queue.Empty:
                    break
                got = True
                if out.finished:
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

    async def result(self) -> ReqOutput:
        async for _ in self.outputs():
            pass
        assert self.final is not None
        return self.final


async def merge(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, ReqOutput]]:
    """(index, output) pairs from every stream, in arrival order, until all have finished."""
    if len(streams) == 1:
        async for out in streams[0].outputs():
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        async for out in s.outputs():
            await q.put((i, out))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        pending = len(streams)
        while pending:
            i, out = await q.get()
            if out.finished:
                pending -= 1
            yield i, out
    finally:
        for t in tasks:
            t.cancel()


class AsyncEngine:
    """Requests from coroutines; the engine loop runs on its background thread."""

    def __init__(self, engine: Engine, on_finish: Callable[[Req, ReqOutput], None] | None = None):
        self.engine = engine
        self.on_finish = on_finish  # once per request, on the detokenizer thread, before its final output is visible
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._live: set[str] = set()  # rids submitted and not finished (a duplicate live rid is refused)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.engine.start_background_loop()

    async def generate(self, prompt: str | list[str] | None = None, sampling_params: Any = None,
                       input_ids: list[int] | list[list[int]] | None = None, return_logprob: Any = False,
                       logprob_start_len: Any = None, top_logprobs_num: Any = None, stream: bool = False,
                       rid: Any = None, return_text_in_logprobs: bool = False):
        """``Engine.generate`` from a coroutine (the background loop starts on first use)."""
        self.start()  # idempotent; binds the wake-ups to the running event loop
        ids_list, single = self.engine.tokenize_prompts(prompt, input_ids)
        reqs = self.engine.expand_requests(ids_list, sampling_params, return_logprob, logprob_start_len,
                                           top_logprobs_num, rid)
        streams = self.submit(reqs, stream)
        tt = TokenText(self.engine.tokenizer.decode) if return_text_in_logprobs else None
        if stream:
            return self._stream_dicts(streams, tt)
        outs = [sglang_dict(await s.result(), tt) for s in streams]
        return outs[0] if single and len(outs) == 1 else outs

    async def _stream_dicts(self, streams: list[RequestStream],
                            tt: TokenText | None = None) -> AsyncIterator[dict[str, Any]]:
        dicts = [SGLangDicts(token_text=tt) for _ in streams]
        try:
            async for i, out in merge(streams):
                yield dicts[i].add(out)
        finally:
            for s in streams:
                if s.final is None:
                    self.abort(s.rid)

    def submit(self, reqs: list[Req], stream: bool) -> list[RequestStream]:
        """Enqueue Reqs made by ``Engine.expand_requests`` (validated there, once).

        A rid that is already live (submitted, not finished), or given twice in one call, is a ValueError
        (SGLang refuses duplicate rids too): aborts by rid would otherwise hit the wrong request.
        """
        rids = [r.rid for r in reqs]
        with self._lock:
            dup = sorted(x for x, c in collections.Counter(rids).items() if c > 1 or x in self._live)
            if dup:
                raise ValueError(f"'rid' {dup[0]!r} is already in use by a running request; rids must be unique "
                                 "among live requests (omit 'rid' to get a fresh one)")
            self._live.update(rids)
        try:
            return self._submit(reqs, stream)
        except BaseException:
            with self._lock:
                self._live.difference_update(rids)
            raise

    def _finished(self, req: Req, out: ReqOutput) -> None:  # detokenizer thread, before the final output is visible
        with self._lock:
            self._live.discard(req.rid)
        if self.on_finish is not None:
            try:
                self.on_finish(req, out)
            except Exception:  # noqa: BLE001 - metrics / logging must never cost the client its answer
                logger.exception("recording finished request %s failed", req.rid)

    def _submit(self, reqs: list[Req], stream: bool) -> list[RequestStream]:
        loop = self.loop
        streams: list[RequestStream] = []

        def waker(i: int) -> Callable[[], None]:
            def wake() -> None:  # detokenizer thread
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(streams[i].wake.set)
            return wake

        # the handles exist only after submit; their wake hooks look the stream up by index
        handles = self.engine.submit(reqs, stream, on_finish=self._finished, wake=None)
        for i, h in enumerate(handles):
            streams.append(RequestStream(h, self.alive))
            h.wake = waker(i)
        return streams

    def alive(self) -> bool:
        """The scheduler thread runs."""
        return self.engine.is_alive()

    def abort(self, rid: str | None) -> None:
        self.engine.abort(rid)

    def shutdown(self) -> None:
        self.engine.shutdown()

    def load(self) -> LoadView:
        return self.engine.load()
