"""POST /generate: SGLang's native API.

Non-streaming: the output dict (``text``, ``output_ids``, ``meta_info``) of one
request, or a list for a batch or ``n > 1`` (prompt-major). Streaming: one
``data: {json}`` event per step with the *cumulative* text and ids (SGLang's
default), an ``index`` when several requests share the stream, and a final
``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from impl.server.async_engine import AsyncEngine, EngineDeadError, RequestStream
from impl.server.req_builder import Submission
from impl.server.streaming import DONE, abort_unfinished, error_event, json_safe, merge, sse, stable_text, until_disconnect


def _with_stable_text(out: dict[str, Any], stops: list[str]) -> dict[str, Any]:
    finished = out["meta_info"]["finish_reason"] is not None
    text = stable_text(out["text"], stops, finished)
    return out if text == out["text"] else {**out, "text": text}


async def generate_response(request: Request, aengine: AsyncEngine, sub: Submission, stream: bool):
    streams = aengine.submit(sub.reqs, stream)
    many = len(streams) > 1
    if stream:
        return StreamingResponse(_stream(aengine, streams, many), media_type="text/event-stream")

    async def collect() -> list[dict[str, Any]]:
        return [await s.result() for s in streams]

    outs = await until_disconnect(request, collect(), lambda: abort_unfinished(streams, aengine.abort))
    if outs is None:  # the client went away; nobody reads this
        return JSONResponse({}, status_code=499)
    return JSONResponse(json_safe(outs if many or not sub.single else outs[0]))


async def _stream(aengine: AsyncEngine, streams: list[RequestStream], many: bool) -> AsyncIterator[bytes]:
    try:
        async for i, out in merge(streams):
            out = _with_stable_text(out, streams[i].req.sampling_params.stop)
            if many:
                out = {**out, "index": i}
            yield sse(out)
        yield DONE
    except EngineDeadError as e:
        yield error_event(e)
        yield DONE
    finally:
        abort_unfinished(streams, aengine.abort)
