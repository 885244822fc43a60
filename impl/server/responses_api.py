"""POST /v1/responses: OpenAI's Responses API, answered through the chat path; its responses stored for
``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}`` (``response_store.py``).

The body's ``instructions`` and ``input`` items become chat messages (a text input is one user message;
``message`` items keep their role (``developer`` is the chat path's system); ``function_call`` items become an
assistant message's ``tool_calls``, ``function_call_output`` items ``tool`` messages), after the conversation of
the stored response ``previous_response_id`` names (its input and output, not its instructions), ``tools`` /
``tool_choice`` / ``text.format`` / ``max_output_tokens`` the chat fields, and the chat request model then
validates the whole (so every chat bound and refusal holds). The answer's chat choice becomes the response's
``output`` items: a ``message`` with one ``output_text`` part, and a ``function_call`` item per parsed call;
``status`` is ``incomplete`` (``max_output_tokens``) when the token budget ended it. Streamed, the chat deltas
become the Responses events (``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ..., their ``.done`` events, and
``response.completed`` / ``response.incomplete``), each with its ``sequence_number``. With ``include:
["message.output_text.logprobs"]`` the text part (and each delta) carries chat's logprob entries, each with its
``top_logprobs`` most likely tokens. ``truncation: "auto"`` drops the oldest items (whole turns) until the input
fits the context (``truncated``; the stored conversation stays whole). A completed, incomplete or cancelled
response is stored (unless ``store: false``) before its answer, or its last event, is sent; a failed or abandoned
one is not, unless it ran in the background. ``background: true`` answers at once and generates without the client
(``background_responses.py``: its status and events by GET, ``POST /v1/responses/{id}/cancel``). A response whose
request was aborted (``/abort_request``, a cancel, ``/pause_generation`` in ``abort`` mode) is ``cancelled``: its
open items end ``incomplete`` and its stream ends without a terminal event (OpenAI defines none for it).
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Literal

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.requests import Request

from impl.engine.output import ReqOutput
from impl.server.async_engine import AsyncEngine, RequestStream
from impl.server.background_responses import BackgroundResponses, BackgroundRun, replay
from impl.server.errors import APIError, error_response, parse_json
from impl.server.openai_api import Call, ChoiceState, delta_chunk
from impl.server.response_store import ResponseStore, StoredResponse
from impl.server.streaming import failure_of, json_safe, sse, until_disconnect
from impl.server.unserved_fields import TEXT_ONLY
from impl.tool_calls.stream import ToolCallStream

_ROLES = ("user", "assistant", "system", "developer")
_ITEM_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}
logger = logging.getLogger("impl.server")


@dataclass
class Turn:
    """One request's part of a conversation: its input items (with ids) and the conversation through its input
    as chat messages (the previous response's, then this input's; no instructions); ``store``: where its
    response goes (None: not stored)."""

    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    store: ResponseStore | None

    @staticmethod
    def of(body: Any, previous: StoredResponse | None, store: ResponseStore | None) -> Turn:
        items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) \
            else body.input
        conversation = copy.deepcopy(previous.conversation) if previous is not None else []
        for i, item in enumerate(items):
            conversation.extend(_message(item, i, conversation))
        return Turn([_input_item(it) for it in items], conversation, store)

    def keep_events(self, obj: dict[str, Any], events: tuple[bytes, ...]) -> None:
        """Add a finished background response's events to its stored entry (left without them, with a warning,
        when they do not fit the store's budget)."""
        if self.store is None or not obj.get("store"):
            return
        entry = self.store.get(obj["id"])
        if entry is None:
            return
        if not self.store.put(StoredResponse.of(entry.response, entry.input_items, entry.conversation, events)):
            logger.warning("Response %s: its %d stream events are larger than YOCO_RESPONSES_STORE_MB: not kept "
                           "(GET ?stream=true cannot replay them)", obj["id"], len(events))

    def keep(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store the answered response object (when asked); the object as answered ("store" false when it alone
        outgrew the store's budget)."""
        if self.store is None:
            return obj
        obj = json_safe(obj)
        entry = StoredResponse.of(obj, self.input_items, self.conversation + [_assistant_turn(obj["output"])])
        if self.store.put(entry):
            return obj
        logger.warning("Response %s (%d bytes) is larger than YOCO_RESPONSES_STORE_MB: not stored", obj["id"],
                       entry.nbytes)
        return {**obj, "store": False}


def truncated(conversation: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """OpenAI's ``truncation: "auto"``: the conversation without as few of its oldest items as let ``fits`` hold,
    cut before a user message (the template's turns stay whole); from the last user message on when nothing
    longer fits (the request is then refused as without truncation)."""
    if fits(conversation):
        return conversation
    starts = [i for i, m in enumerate(conversation) if m.get("role") == "user" and i > 0]
    lo, hi, best = 0, len(starts) - 1, len(starts) - 1
    while lo <= hi:  # a later cut is a shorter prompt: the first cut that fits, by bisection
        mid = (lo + hi) // 2
        if fits(conversation[starts[mid]:]):
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return conversation[starts[best]:] if starts else conversation


def chat_request(body: Any, chat_model: type[BaseModel], conversation: list[dict[str, Any]]) -> Any:
    """The chat request a Responses body asks for, ``conversation`` its messages after the instructions
    (validated by ``chat_model``; its refusals are 400s)."""
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    chat: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user,
    }
    if body.include:  # message.output_text.logprobs
        chat.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    if body.tools:
        chat["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in body.tools]
    tc = body.tool_choice
    if tc is not None:
        chat["tool_choice"] = tc if isinstance(tc, str) else {"type": "function", "function": {"name": tc.name}}
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}
    raw = json.dumps({k: v for k, v in chat.items() if v is not None}).encode()
    try:
        return parse_json(raw, chat_model)
    except APIError as e:  # the chat model names its own fields: say where they came from
        raise APIError(400, f"{e.message} (in the chat request built from the input)", e.param) from None


def _message(item: Any, i: int, before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat message(s) of input item ``i`` (a function call joins the assistant message before it)."""
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise APIError(400, f"'{where}' must be an object (a message, function_call or function_call_output item)",
                       where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise APIError(400, f"'{where}.role' must be one of {list(_ROLES)}, got {role!r:.80}", f"{where}.role")
        return [{"role": role, "content": _content(item.get("content"), where)}]  # (developer: the chat path's)
    if kind == "function_call":
        call = {"id": _string(item, "call_id", where), "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
        last = before[-1] if before else None
        if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last.get("content"):
            last["tool_calls"].append(call)  # parallel calls: one assistant turn
            return []
        return [{"role": "assistant", "tool_calls": [call]}]
    if kind == "function_call_output":
        return [{"role": "tool", "tool_call_id": _string(item, "call_id", where),
                 "content": _string(item, "output", where)}]
    raise APIError(400, f"'{where}': items of type {kind!r:.80} are not served (message, function_call and "
                        "function_call_output are)", f"{where}.type")


def _input_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as ``input_items`` lists it: with an id, a message's text as a part."""
    kind = item.get("type", "message")
    out = {"id": _ITEM_ID_PREFIX[kind] + uuid.uuid4().hex, "type": kind, **item}
    if kind == "message":
        text_kind = "output_text" if item["role"] == "assistant" else "input_text"
        content = item["content"]
        out.update(status="completed", content=[{"type": text_kind, "text": content}] if isinstance(content, str)
                   else content)
    return out


def _assistant_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A response's output items as the assistant message a follow-up's chat template sees."""
    text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant"}
    if text or not calls:
        msg["content"] = text
    if calls:
        msg["tool_calls"] = calls
    return msg


def _string(item: dict[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise APIError(400, f"'{where}.{key}' must be a string", f"{where}.{key}")
    return v


def _content(content: Any, where: str) -> Any:
    """A message item's content as chat content: a text, or its text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"'{where}.content' must be a string or a list of text parts", f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise APIError(400, f"'{where}.content[{j}]': only text parts (input_text, output_text) are read; "
                                f"{TEXT_ONLY}", f"{where}.content[{j}]")
        parts.append({"type": "text", "text": part["text"]})
    return parts


# ---------------------------------------------------------------- the response object


class _Response:
    """The response object of one call, as it grows."""

    def __init__(self, body: Any, model: str, stored: bool):
        self.body, self.model, self.stored = body, model, stored
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.final: dict[str, Any] | None = None  # the finished response object (as stored), once there is one

    def obj(self, status: str, output: list[dict[str, Any]], final: ReqOutput | None = None) -> dict[str, Any]:
        b = self.body
        tc = b.tool_choice
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "incomplete_details": None, "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature, "top_p": b.top_p,
            "tool_choice": (tc if isinstance(tc, str) else tc.model_dump()) if tc is not None else "auto",
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
            "text": {"format": b.text.format.model_dump(by_alias=True, exclude_none=True)
                     if b.text is not None and b.text.format is not None else {"type": "text"}},
            "metadata": b.metadata or {}, "store": self.stored, "user": b.user, "usage": None,
            "previous_response_id": b.previous_response_id, "truncation": b.truncation or "disabled",
            "background": bool(b.background),
        }
        if final is not None:
            out["completed_at"] = int(time.time()) if status == "completed" else None
            if status == "incomplete":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            out["usage"] = {
                "input_tokens": final.prompt_tokens,
                "input_tokens_details": {"cached_tokens": final.cached_tokens},
                "output_tokens": final.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": final.prompt_tokens + final.completion_tokens,
            }
        return out


def _status(final: ReqOutput) -> str:
    """The status of a finished request that did not fail (``failure_of`` is checked first: an abort with a status
    code is a failure, one without it a client's or operator's abort)."""
    return {"length": "incomplete", "abort": "cancelled"}.get(final.finish_type or "", "completed")


def _failed(resp: _Response, output: list[dict[str, Any]], status: int, message: str) -> dict[str, Any]:
    return {**resp.obj("failed", output), "error": {"code": "server_error" if status >= 500 else "invalid_request",
                                                     "message": message}}


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    """A message item: ``in_progress`` (streamed, no part yet), ``completed`` or ``incomplete`` (cut by the budget)."""
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(tool_call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    fn = tool_call["function"]
    return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": tool_call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if status == "completed" else "", "status": status}


def output_items(choice: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """A non-streamed chat choice's message as the response's output items (the message ``status`` as the
    response's; its text part with the choice's logprobs when asked)."""
    msg = choice["message"]
    items = []
    if msg.get("content") or not msg.get("tool_calls"):
        items.append(_message_item(msg.get("content") or "", status))
        if choice.get("logprobs") is not None:
            items[0]["content"][0]["logprobs"] = choice["logprobs"]["content"]
    items += [_call_item(tc) for tc in msg.get("tool_calls") or []]
    return items


async def respond(request: Request, aengine: AsyncEngine, call: Call, body: Any, model: str, turn: Turn,
                  runs: BackgroundResponses):
    resp = _Response(body, model, turn.store is not None)
    if body.background:
        return _start_background(aengine, call, body, resp, turn, runs)
    (stream,) = aengine.submit(call.sub.reqs, body.stream)
    if body.stream:
        events = (sse(ev) async for ev in _events(aengine, call, stream, resp, turn))
        return StreamingResponse(events, media_type="text/event-stream")
    final = await until_disconnect(request, stream.result(), lambda: aengine.abort(stream.rid))
    if final is None:
        return JSONResponse({}, status_code=499)
    failed = failure_of(final)
    if failed is not None:
        return error_response(failed[0], failed[1])
    status = _status(final)
    items = output_items(call.choice(0, final), "incomplete" if status == "cancelled" else status)
    return JSONResponse(json_safe(turn.keep(resp.obj(status, items, final))))


def _start_background(aengine: AsyncEngine, call: Call, body: Any, resp: _Response, turn: Turn,
                      runs: BackgroundResponses):
    """Submit the request, drive its events on a task of its own, answer the queued response object (or, with
    ``stream``, its events as they come)."""
    runs.check_room()
    (stream,) = aengine.submit(call.sub.reqs, True)
    run = BackgroundRun(json_safe(resp.obj("queued", [])), turn.input_items, stream)

    def on_end(run: BackgroundRun, error: BaseException | None) -> None:
        if resp.final is None:  # the engine died (or the server is shutting down) before the request finished
            why = f"the server stopped this response ({type(error).__name__}: {error})"
            resp.final = turn.keep(json_safe(_failed(resp, [], 503, why)))
            event = {"type": "response.failed", "sequence_number": len(run.events), "response": resp.final}
            run.record(event, sse(event))
        run.response = resp.final
        turn.keep_events(resp.final, tuple(run.events))

    runs.start(run, _events(aengine, call, stream, resp, turn, background=True), sse, on_end)
    if body.stream:
        return StreamingResponse(run.follow(-1), media_type="text/event-stream")
    return JSONResponse(run.response)


async def _events(aengine: AsyncEngine, call: Call, stream: RequestStream, resp: _Response,
                  turn: Turn, background: bool = False) -> AsyncIterator[dict[str, Any]]:
    """The response's stream events (JSON-safe objects), each with its ``sequence_number``; ``resp.final`` set
    (and stored, as the turn says) before the last is yielded. ``background``: created ``queued``, and a failed
    response stored too."""
    seq = itertools.count()

    def ev(kind: str, **fields: Any) -> dict[str, Any]:
        return json_safe({"type": kind, "sequence_number": next(seq), **fields})

    output: list[dict[str, Any]] = []
    msg: dict[str, Any] | None = None  # the open message item, while text streams into it
    state = ChoiceState(tools=ToolCallStream() if call.tool_calls else None)

    def close_message(status: str = "completed") -> list[dict[str, Any]]:
        nonlocal msg
        if msg is None:
            return []
        part = {"type": "output_text", "text": msg["text"], "annotations": []}
        if call.logprobs:
            part["logprobs"] = msg["logprobs"]
        done = {**msg, "status": status, "content": [part]}
        done.pop("text")
        done.pop("logprobs")
        where = {"item_id": msg["id"], "output_index": len(output)}
        out = [ev("response.output_text.done", **where, content_index=0, text=msg["text"],
                  logprobs=msg["logprobs"]),
               ev("response.content_part.done", **where, content_index=0, part=part),
               ev("response.output_item.done", output_index=len(output), item=done)]
        output.append(done)
        msg = None
        return out

    try:
        yield ev("response.created", response=resp.obj("queued" if background else "in_progress", []))
        yield ev("response.in_progress", response=resp.obj("in_progress", []))
        async for out in stream.outputs():
            failed = failure_of(out)
            if failed is not None:
                yield ev("error", code=str(failed[0]), message=failed[1], param=None)
                resp.final = json_safe(_failed(resp, output, *failed))
                if background:
                    resp.final = turn.keep(resp.final)
                yield ev("response.failed", response=resp.final)
                return
            chunk = delta_chunk(call, 0, out, state)
            delta = chunk["delta"] if chunk is not None else {}
            # (a token whose text is held back, a partial character, still brings its logprob entry)
            lps = chunk["logprobs"]["content"] if chunk is not None and chunk.get("logprobs") else []
            if delta.get("content") or (lps and not delta.get("tool_calls")):
                if msg is None:
                    item = _message_item("", "in_progress")
                    msg = {**item, "text": "", "logprobs": []}
                    yield ev("response.output_item.added", output_index=len(output), item=item)
                    yield ev("response.content_part.added", item_id=item["id"], output_index=len(output),
                             content_index=0, part={"type": "output_text", "text": "", "annotations": []})
                msg["text"] += delta.get("content") or ""
                msg["logprobs"] += lps
                yield ev("response.output_text.delta", item_id=msg["id"], output_index=len(output), content_index=0,
                         delta=delta.get("content") or "", logprobs=lps)
            for tc in delta.get("tool_calls") or []:
                for b in close_message():
                    yield b
                item, where = _call_item(tc, "in_progress"), {"output_index": len(output)}
                args = tc["function"]["arguments"]
                yield ev("response.output_item.added", **where, item=item)
                yield ev("response.function_call_arguments.delta", **where, item_id=item["id"], delta=args)
                yield ev("response.function_call_arguments.done", **where, item_id=item["id"], arguments=args)
                item = {**item, "arguments": args, "status": "completed"}
                yield ev("response.output_item.done", **where, item=item)
                output.append(item)
        final = stream.final
        assert final is not None
        status = _status(final)
        for b in close_message("incomplete" if status == "cancelled" else status):
            yield b
        resp.final = turn.keep(json_safe(resp.obj(status, output, final)))
        if status != "cancelled":  # (OpenAI's stream has no event for a cancelled response: it just ends)
            yield ev("response.completed" if status == "completed" else "response.incomplete", response=resp.final)
    finally:
        if stream.final is None:  # the client left (or the engine died): stop the request
            aengine.abort(stream.rid)


# ---------------------------------------------------------------- the stored responses


def add_store_routes(app: FastAPI, store: ResponseStore, runs: BackgroundResponses, aengine: AsyncEngine) -> None:
    """GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items and POST /v1/responses/{id}/cancel over
    ``store`` and the background responses still running (``runs``)."""

    def stored(response_id: str) -> StoredResponse:
        entry = store.get(response_id)
        if entry is None:
            raise APIError(404, store.not_found(response_id), "response_id")
        return entry

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, stream: bool = Query(False, description="a background response's "
                                                                   "stream events, replayed and then followed"),
                           starting_after: int = Query(-1, ge=-1, le=2**31 - 1, description="stream only the "
                                                       "events after this sequence number")):
        """A stored response object, as it was answered; a background one's as it stands (``?stream=true``: its
        events after ``starting_after``, then the live ones until it finishes)."""
        run = runs.get(response_id)
        if run is not None:
            return StreamingResponse(run.follow(starting_after), media_type="text/event-stream") if stream \
                else JSONResponse(run.now())
        entry = stored(response_id)
        if not stream:
            return JSONResponse(entry.response)
        if not entry.events:
            why = ("was not created with background true: only a background response's events are kept"
                   if not entry.response.get("background") else "kept no events (they outgrew "
                   "YOCO_RESPONSES_STORE_MB)")
            raise APIError(400, f"response {response_id!r:.260} {why}; GET it without stream", "stream")
        return StreamingResponse(replay(entry.events, starting_after), media_type="text/event-stream")

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str):
        """Stop a background response (a finished one is answered as it stands, OpenAI's rule)."""
        run = runs.get(response_id)
        if run is not None:
            await runs.cancel(run, aengine.abort)
            return JSONResponse(run.now())
        entry = stored(response_id)
        if not entry.response.get("background"):
            raise APIError(400, f"response {response_id!r:.260} was not created with background true: only "
                                "background responses can be cancelled (a foreground one stops when its client "
                                "disconnects, or by /abort_request with its rid)", "response_id")
        return JSONResponse(entry.response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        """Delete a stored response (a background one still running is cancelled first)."""
        run = runs.get(response_id)
        if run is not None:
            await runs.cancel(run, aengine.abort)
            if runs.get(response_id) is not None:
                raise APIError(503, f"response {response_id!r:.260} is still stopping (the engine has not reached "
                                    "its abort yet); retry the DELETE", "response_id")
        if not store.delete(response_id):
            raise APIError(404, store.not_found(response_id), "response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, limit: int = Query(20, ge=1, le=100),
                          order: Literal["asc", "desc"] = Query("desc"),
                          after: str | None = Query(None, max_length=256, description="list the items after this id"),
                          before: str | None = Query(None, max_length=256,
                                                     description="list the items before this id")):
        """A stored response's input items (OpenAI's list: newest first unless ``order=asc``)."""
        run = runs.get(response_id)
        items = run.input_items if run is not None else stored(response_id).input_items
        items = items if order == "asc" else items[::-1]
        ids = [it["id"] for it in items]
        for name, cursor in (("after", after), ("before", before)):
            if cursor is not None and cursor not in ids:
                raise APIError(400, f"'{name}': item {cursor!r:.260} is not an input item of response "
                                    f"{response_id!r:.260}", name)
        lo = ids.index(after) + 1 if after is not None else 0
        hi = ids.index(before) if before is not None else len(items)
        page = items[lo:hi][:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": lo + len(page) < hi}
