"""Server-sent events and the stream plumbing shared by /generate and the OpenAI routes.

* ``sse(obj)``: one ``data: {json}\\n\\n`` event; ``DONE`` ends every stream.
* ``merge``: outputs of several requests (a batch, or ``n`` choices) in arrival order
  (``impl/server/async_engine.py``). Streamed text needs no fixing up here: a
  ``ReqOutput``'s text is already stable (``impl/engine/detokenizer_stage.py``).
* ``until_disconnect``: await a result, aborting the requests if the client goes away.
* ``sse_stream``: a streaming route's events around its own per-output event: failures, the end, aborts.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Sequence, TypeVar

from starlette.requests import Request

from impl.engine.output import ReqOutput
from impl.server.async_engine import EngineDeadError, RequestStream, merge

__all__ = ["DONE", "abort_unfinished", "dumps", "error_event", "json_safe", "merge", "sse", "sse_stream", "until_disconnect"]

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats (a -inf logprob) by -9999.0 / 9999.0 so the body is valid JSON."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return 9999.0 if obj > 0 else -9999.0
        return obj
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


# Characters str.splitlines() (and so httpx's iter_lines) treats as line ends that JSON leaves raw with
# ensure_ascii=False: escaped, so that one event stays one line for such clients (a random-weight model
# can emit U+0085 as a byte-fallback character; a client then read half an event).
_LINE_BREAKS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def dumps(obj: Any) -> str:
    return json.dumps(json_safe(obj), ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode("utf-8")


async def until_disconnect(request: Request, work: Awaitable[T], on_disconnect: Callable[[], None]) -> T | None:
    """Await ``work``; if the client disconnects first, call ``on_disconnect`` and return None."""

    async def disconnected() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        on_disconnect()
        return None
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()


def failure_of(out: ReqOutput) -> tuple[int, str] | None:
    """(HTTP status, message) when this final output says the request failed (not a client abort)."""
    fr = out.finish_reason
    if fr is not None and fr.type == "abort" and fr.status_code:
        return int(fr.status_code), str(fr.message or "the request failed")
    return None


def error_event(exc: EngineDeadError | str, status: int = 503, index: int | None = None) -> bytes:
    """An OpenAI-style error object as a stream event (the stream's requests failed or its engine died)."""
    kind = "ServiceUnavailableError" if status == 503 else ("BadRequestError" if status < 500 else "InternalServerError")
    event: dict[str, Any] = {"error": {"message": str(exc), "type": kind, "code": status}}
    if index is not None:
        event["index"] = index
    return sse(event)


def abort_unfinished(streams: Sequence[RequestStream], abort: Callable[[str], None]) -> None:
    for s in streams:
        if s.final is None:
            abort(s.rid)


async def sse_stream(streams: Sequence[RequestStream], abort: Callable[[str], None],
                     event: Callable[[int, ReqOutput], bytes | None],
                     tail: Callable[[], Iterable[bytes]] = tuple) -> AsyncIterator[bytes]:
    """The events of ``streams`` in arrival order: ``event(i, out)`` for each output of request ``i`` (None: nothing
    to send), a failed request's error event in its place (indexed when several requests share the stream), then
    ``tail()``'s events once every request has finished, then ``DONE``. An engine that dies ends the stream with
    its error event and ``DONE``; however the stream ends, its unfinished requests are aborted."""
    many = len(streams) > 1
    try:
        async for i, out in merge(streams):
            failed = failure_of(out)
            if failed is not None:
                yield error_event(failed[1], failed[0], i if many else None)
                continue
            body = event(i, out)
            if body is not None:
                yield body
        for body in tail():
            yield body
        yield DONE
    except EngineDeadError as e:
        yield error_event(e)
        yield DONE
    finally:
        abort_unfinished(streams, abort)
