"""POST /generate: SGLang's native API.

Each ``ReqOutput`` becomes SGLang's dict (``ReqOutput.to_sglang()``).
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
from impl.server.streaming import DONE, abort_unfinished, error_event, json_safe, merge, sse, until_disconnect


async def generate_response(request: Request, aengine: AsyncEngine, sub: Submission, stream: bool):
    streams = aengine.submit(sub.reqs, stream)
    many = len(streams) > 1
    if stream:
        return StreamingResponse(_stream(aengine, streams, many), media_type="text/event-stream")

    async def collect() -> list[dict[str, Any]]:
        return [(await s.result()).to_sglang() for s in streams]

    outs = await until_disconnect(request, collect(), lambda: abort_unfinished(streams, aengine.abort))
    if outs is None:  # the client went away; nobody reads this
        return JSONResponse({}, status_code=499)
    return JSONResponse(json_safe(outs if many or not sub.single else outs[0]))


async def _stream(aengine: AsyncEngine, streams: list[RequestStream], many: bool) -> AsyncIterator[bytes]:
    try:
        async for i, out in merge(streams):
            body = out.to_sglang()
            if many:
                body["index"] = i
            yield sse(body)
        yield DONE
    except EngineDeadError as e:
        yield error_event(e)
        yield DONE
    finally:
        abort_unfinished(streams, aengine.abort)
