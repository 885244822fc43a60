"""Server-sent events and the stream plumbing shared by /generate and the OpenAI routes.

* ``sse(obj)``: one ``data: {json}\\n\\n`` event; ``DONE`` ends every stream.
* ``stable_text``: the part of a request's cumulative text that can no longer
  change: a trailing partial UTF-8 character (U+FFFD) and a trailing prefix of
  a stop string are held back until the request finishes (the final text is
  stop-trimmed), so streamed text is always a prefix of the final text.
* ``merge``: outputs of several requests (a batch, or ``n`` choices) in arrival order.
* ``until_disconnect``: await a result, aborting the requests if the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

from starlette.requests import Request

from impl.server.async_engine import EngineDeadError, RequestStream

DONE = b"data: [DONE]\n\n"
REPLACEMENT_CHAR = "\ufffd"
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


def dumps(obj: Any) -> str:
    return json.dumps(json_safe(obj), ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode("utf-8")


def stable_text(text: str, stops: Sequence[str], finished: bool) -> str:
    if finished:
        return text
    text = text.rstrip(REPLACEMENT_CHAR)
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return text[: len(text) - hold] if hold else text


async def merge(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(index, output) pairs from every stream until all have finished."""
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
            if out["meta_info"]["finish_reason"] is not None:
                pending -= 1
            yield i, out
    finally:
        for t in tasks:
            t.cancel()


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


def failure_of(out: dict[str, Any]) -> tuple[int, str] | None:
    """(HTTP status, message) when this final output says the request failed (not a client abort)."""
    fr = out["meta_info"].get("finish_reason")
    if fr and fr.get("type") == "abort" and fr.get("status_code"):
        return int(fr["status_code"]), str(fr.get("message") or "the request failed")
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
