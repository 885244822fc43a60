"""POST /generate: SGLang's native API.

Each request's ``ReqOutput`` objects (what is new in each emission) become
SGLang's dicts (``impl/engine/output.py:SGLangDicts``). Non-streaming: the
output dict (``text``, ``output_ids``, ``meta_info``) of one request, or a list
for a batch or ``n > 1`` (prompt-major). Streaming: one ``data: {json}`` event
per step with the *cumulative* text and ids (SGLang's default; the only
cumulative fields rebuilt), an ``index`` when several requests share the
stream, and a final ``data: [DONE]``. Logprobs are incremental in a stream: each
event's ``output_token_logprobs`` / ``output_top_logprobs`` hold only the tokens
that are new since the previous event of that request, and the prompt's
``input_*`` lists come once, in its first event. A request that failed in the engine is a 500 (or
its stream's error event, then ``[DONE]``).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from impl.engine.output import ReqOutput, SGLangDicts, TokenText, sglang_dict
from impl.server.async_engine import AsyncEngine, RequestStream
from impl.server.req_builder import Submission
from impl.server.errors import error_response
from impl.server.streaming import abort_unfinished, failure_of, json_safe, sse, sse_stream, until_disconnect


async def generate_response(request: Request, aengine: AsyncEngine, sub: Submission, stream: bool,
                            token_text: TokenText | None = None, prompt_ids: bool = False):
    """``token_text``: SGLang's ``return_text_in_logprobs`` (each logprob entry with its token's text);
    ``prompt_ids``: SGLang's ``return_prompt_token_ids`` (every output dict with its prompt's ids)."""
    streams = aengine.submit(sub.reqs, stream)
    many = len(streams) > 1

    def with_prompt(i: int, d: dict) -> dict:
        if prompt_ids:
            d["prompt_token_ids"] = sub.reqs[i].origin_input_ids
        return d

    if stream:
        return StreamingResponse(_stream(aengine, streams, many, token_text, with_prompt),
                                 media_type="text/event-stream")

    async def collect() -> list[ReqOutput]:
        return [await s.result() for s in streams]

    finals = await until_disconnect(request, collect(), lambda: abort_unfinished(streams, aengine.abort))
    if finals is None:  # the client went away; nobody reads this
        return JSONResponse({}, status_code=499)
    failed = next((f for f in map(failure_of, finals) if f is not None), None)
    if failed is not None:
        return error_response(failed[0], failed[1])
    outs = [with_prompt(i, sglang_dict(f, token_text)) for i, f in enumerate(finals)]
    return JSONResponse(json_safe(outs if many or not sub.single else outs[0]))


def _stream(aengine: AsyncEngine, streams: list[RequestStream], many: bool, token_text: TokenText | None,
            finish: Callable[[int, dict], dict]) -> AsyncIterator[bytes]:
    dicts = [SGLangDicts(incremental_logprobs=True, token_text=token_text) for _ in streams]

    def event(i: int, out: ReqOutput) -> bytes:
        body = finish(i, dicts[i].add(out))
        if many:
            body["index"] = i
        return sse(body)

    return sse_stream(streams, aengine.abort, event)
