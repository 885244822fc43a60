"""POST /v1/completions and /v1/chat/completions: OpenAI's response and chunk shapes.

Choice ``k`` of a batch is prompt ``k // n``, choice ``k % n``. Usage counts
each prompt once and every choice's tokens (OpenAI's rule). Streams send text
deltas; every choice gets exactly one chunk with a ``finish_reason`` (it also
carries the choice's last delta), then an optional usage chunk
(``stream_options.include_usage``; with vLLM's ``continuous_usage_stats``
every chunk also carries its choice's usage so far), then ``data: [DONE]``. Everything is read
from typed ``ReqOutput`` objects (``impl/engine/output.py``), which carry what
is new since the previous one: a chunk formats its output's deltas as they are,
a non-streamed choice its request's only output. Completions' ``echo`` puts
the prompt's text (``Submission.echo``; chat's: a final assistant message's)
before a choice's text, in its first chunk when streamed, and with logprobs the prompt tokens' entries (the
request's first output carries them) before the output's. vLLM's
``prompt_logprobs`` (never streamed) comes from the same entries with their
ranks; the engine's top entries are the larger of the two asked ``k``s, each
list cut to its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from impl.engine.output import ReqOutput, TokenText
from impl.server import beam_search
from impl.server.async_engine import AsyncEngine, RequestStream
from impl.server.req_builder import Submission
from impl.server.errors import error_response
from impl.tool_calls.gemma4 import ParsedCall, split_calls
from impl.tool_calls.stream import ToolCallStream
from impl.server.streaming import abort_unfinished, failure_of, json_safe, sse, sse_stream, until_disconnect


def usage(sub: Submission, finals: list[ReqOutput]) -> dict[str, Any]:
    firsts = [finals[p * sub.n] for p in range(sub.num_prompts)]
    prompt = sum(f.prompt_tokens for f in firsts)
    completion = sum(f.completion_tokens for f in finals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(f.cached_tokens for f in firsts)},
    }


def _output_logprobs(out: ReqOutput) -> tuple[list[tuple[float, int]], list[Any]]:
    """(token logprob pairs, top entries) of the output tokens new in ``out``."""
    lp = out.logprobs_delta
    if lp is None:
        return [], []
    return lp.output_token_logprobs, lp.output_top_logprobs


# ---------------------------------------------------------------- logprobs


def completion_logprobs(o: ReqOutput, text_offset: int, tt: TokenText, k: int, echo: str | None = None
                        ) -> dict[str, Any]:
    """OpenAI completions logprobs of the output tokens new in ``o`` (its text starts at ``text_offset``), each
    with its ``k`` top entries. With ``echo`` (the prompt's text, which the choice's text starts with) the prompt
    tokens' entries come first: their logprobs given the tokens before them (the first one None, as its top entry),
    offsets running from 0 over the tokens' texts, and the output tokens' offsets from the end of the echoed text."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(entries: Sequence[tuple[float | None, int]], tops: Sequence[Any], offset: int) -> None:
        for i, (lp, tok) in enumerate(entries):
            s = tt(tok)
            out["tokens"].append(tt.label(tok))
            out["token_logprobs"].append(lp)
            top = tops[i] if i < len(tops) else None
            out["top_logprobs"].append({tt.label(t): l for l, t in top[:k]} if top and k else None)
            out["text_offset"].append(offset)
            offset += len(s)

    if echo is not None and o.logprobs_delta is not None:
        add(o.logprobs_delta.input_token_logprobs, o.logprobs_delta.input_top_logprobs, 0)
        text_offset = len(echo)
    add(*_output_logprobs(o), text_offset)
    return out


def chat_logprobs(o: ReqOutput, tt: TokenText, k: int) -> dict[str, Any]:
    toks, tops = _output_logprobs(o)
    content = []
    for i, (lp, tok) in enumerate(toks):
        s = tt.label(tok)
        top = ((tops[i] if i < len(tops) else None) or [])[:k]
        content.append({
            "token": s, "logprob": lp, "bytes": list(tt(tok).encode("utf-8")),
            "top_logprobs": [{"token": tt.label(t), "logprob": l, "bytes": list(tt(t).encode("utf-8"))} for l, t in top],
        })
    return {"content": content}


def prompt_logprobs(o: ReqOutput, tt: TokenText, k: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs`` of a request's only output: per prompt token (the first None: nothing precedes
    it) a dict keyed by token id, the prompt token's entry first, then the ``k`` most likely tokens of its position
    (rank 1..k; the prompt token among them appears once), each ``{logprob, rank, decoded_token}``."""
    lp = o.logprobs_delta
    assert lp is not None and lp.input_token_ranks is not None, "the request asked for prompt ranks"
    out: list[dict[str, dict[str, Any]] | None] = []
    for i, (l, tok) in enumerate(lp.input_token_logprobs):
        if l is None:
            out.append(None)
            continue
        d = {str(tok): {"logprob": l, "rank": lp.input_token_ranks[i], "decoded_token": tt(tok)}}
        for rank, (tl, t) in enumerate((lp.input_top_logprobs[i] or [])[:k], 1):
            d[str(t)] = {"logprob": tl, "rank": rank, "decoded_token": tt(t)}
        out.append(d)
    return out


# ---------------------------------------------------------------- responses


@dataclass
class Call:
    """What one OpenAI call needs besides its requests."""

    kind: str  # "completion" | "chat"
    model: str
    sub: Submission
    logprobs: bool
    include_usage: bool
    token_text: TokenText
    # vLLM's return_token_ids: each choice's output token ids and its prompt's (completions: in the choice; chat:
    # beside the choices)
    token_ids: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): usage so far in every chunk
    tool_calls: bool = False  # chat with tools: function calls in the text become message.tool_calls
    stop_texts: tuple[str, ...] = ()  # dropped from a tool-call answer's text (decoded with special tokens)
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("cmpl-" if self.kind == "completion" else "chatcmpl-") + uuid.uuid4().hex

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"

    def echo_of(self, k: int) -> str | None:
        """The text choice ``k`` starts with (None without echo): completions' prompt, chat's final assistant
        message (vLLM's chat echo)."""
        return None if self.sub.echo is None else self.sub.echo[self.sub.prompt_of(k)]

    def clean(self, text: str) -> str:
        for t in self.stop_texts:
            text = text.replace(t, "")
        return text

    def envelope(self, choices: list[dict[str, Any]], chunk: bool = False, **extra: Any) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.kind == "chat" else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    def beside_choices(self, first: ReqOutput) -> dict[str, Any]:
        """Chat's fields beside the choices (vLLM's: its one prompt's token ids and prompt logprobs), from the first
        choice's output; none for completions, whose choices carry them."""
        out: dict[str, Any] = {}
        if self.kind == "chat" and self.token_ids:
            out["prompt_token_ids"] = self.sub.reqs[0].origin_input_ids
        if self.kind == "chat" and self.sub.prompt_logprobs is not None:
            out["prompt_logprobs"] = prompt_logprobs(first, self.token_text, self.sub.prompt_logprobs)
        return out

    def choice(self, k: int, final: ReqOutput) -> dict[str, Any]:
        """Choice ``k`` of a non-streamed call from its request's only output (deltas = everything)."""
        assert final.output_start == 0, "a non-streamed request has one output"
        c: dict[str, Any] = {"index": k}
        if self.kind == "completion":
            echo = self.echo_of(k)
            c["text"] = final.text if echo is None else echo + final.text
            c["logprobs"] = completion_logprobs(final, 0, self.token_text, self.sub.top_logprobs, echo) \
                if self.logprobs else None
            if self.token_ids:
                c["token_ids"] = final.output_ids_delta
                c["prompt_token_ids"] = self.sub.reqs[k].origin_input_ids
            if self.sub.prompt_logprobs is not None:
                c["prompt_logprobs"] = prompt_logprobs(final, self.token_text, self.sub.prompt_logprobs)
        else:
            echo = self.echo_of(k) or ""
            c["message"] = {"role": "assistant", "content": echo + final.text}
            c["logprobs"] = chat_logprobs(final, self.token_text, self.sub.top_logprobs) if self.logprobs else None
            if self.token_ids:
                c["token_ids"] = final.output_ids_delta
            if self.tool_calls:
                content, calls = split_calls(self.clean(final.text))
                content = echo + content
                c["message"]["content"] = content if content or not calls else None
                if calls:
                    c["message"]["tool_calls"] = [tool_call_dict(call) for call in calls]
                    c["finish_reason"] = "tool_calls" if final.finish_type != "abort" else final.finish_type
                    c["matched_stop"] = final.matched_stop
                    return c
        c["finish_reason"] = final.finish_type
        c["matched_stop"] = final.matched_stop
        return c


async def openai_response(request: Request, aengine: AsyncEngine, call: Call, stream: bool):
    if call.sub.beam is not None:
        return await _beam_response(request, aengine, call)
    streams = aengine.submit(call.sub.reqs, stream)
    if stream:
        return StreamingResponse(_stream(aengine, call, streams), media_type="text/event-stream")

    async def collect() -> list[ReqOutput]:
        return [await s.result() for s in streams]

    finals = await until_disconnect(request, collect(), lambda: abort_unfinished(streams, aengine.abort))
    if finals is None:
        return JSONResponse({}, status_code=499)
    failed = next((f for f in map(failure_of, finals) if f is not None), None)
    if failed is not None:
        return error_response(failed[0], failed[1])
    return _whole(call, finals)


def _whole(call: Call, finals: list[ReqOutput]) -> JSONResponse:
    """A non-streamed call's answer from its choices' only outputs."""
    body = call.envelope([call.choice(k, f) for k, f in enumerate(finals)], usage=usage(call.sub, finals),
                         **call.beside_choices(finals[0]))
    return JSONResponse(json_safe(body))


async def _beam_response(request: Request, aengine: AsyncEngine, call: Call):
    """vLLM's beam search (``impl/server/beam_search.py``): each prompt's ``n`` best sequences are its choices."""
    sub, spec = call.sub, call.sub.beam
    assert spec is not None

    async def run() -> list[ReqOutput]:
        per_prompt = await asyncio.gather(*(beam_search.search(aengine, sub.reqs[p * sub.n], spec, sub.top_logprobs)
                                            for p in range(sub.num_prompts)))
        return [out for outs in per_prompt for out in outs]

    try:
        finals = await until_disconnect(request, run(), lambda: None)  # (cancelling run() aborts its step)
    except beam_search.BeamFailure as e:
        return error_response(e.status, str(e))
    if finals is None:
        return JSONResponse({}, status_code=499)
    return _whole(call, finals)


def tool_call_dict(call: ParsedCall, index: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                         "function": {"name": call.name, "arguments": call.arguments_json}}
    return d if index is None else {"index": index, **d}


@dataclass
class ChoiceState:
    """One streamed choice's progress (also the Responses API's stream, ``responses_api``)."""

    sent_chars: int = 0  # text already sent (completions' text_offset)
    started: bool = False  # a chunk was sent (chat: the role; completions with echo: the prompt)
    tools: ToolCallStream | None = None  # chat with tools: content vs calls of the streamed text


def _stream(aengine: AsyncEngine, call: Call, streams: list[RequestStream]) -> AsyncIterator[bytes]:
    states = [ChoiceState(tools=ToolCallStream() if call.tool_calls else None) for _ in streams]
    extra = {"usage": None} if call.include_usage else {}

    def event(k: int, out: ReqOutput) -> bytes | None:
        first = not states[k].started
        chunk = delta_chunk(call, k, out, states[k])
        if chunk is None:
            return None
        # return_token_ids: the prompt's ids in the choice's first chunk (chat: beside the choice, as vLLM's)
        top = {"prompt_token_ids": call.sub.reqs[k].origin_input_ids} if first and call.token_ids else {}
        if call.kind == "completion" and top:
            chunk["prompt_token_ids"], top = top["prompt_token_ids"], {}
        if call.continuous_usage:  # this choice's request so far
            done = {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                    "total_tokens": out.prompt_tokens + out.completion_tokens}
            return sse(call.envelope([chunk], chunk=True, usage=done, **top))
        return sse(call.envelope([chunk], chunk=True, **extra, **top))

    def usage_event() -> list[bytes]:
        if not call.include_usage:
            return []
        finals = [s.final for s in streams if s.final is not None]
        assert len(finals) == len(streams)  # every stream has finished
        return [sse(call.envelope([], chunk=True, usage=usage(call.sub, finals)))]

    return sse_stream(streams, aengine.abort, event, usage_event)


def delta_chunk(call: Call, k: int, out: ReqOutput, st: ChoiceState) -> dict[str, Any] | None:
    """Choice ``k``'s chunk for its output ``out`` (None: nothing to send yet, e.g. text held back)."""
    if st.tools is not None:
        return _tool_delta_chunk(call, k, out, st, st.tools)
    fr = out.finish_type
    delta = out.text_delta
    per_token = call.logprobs or call.token_ids  # a chunk per new token, even one with no text of its own
    # echo: the choice's first chunk starts with the prompt (the request's first output carries its logprobs), or on
    # chat with the final assistant message
    echo = call.echo_of(k) if not st.started else None
    if not delta and fr is None and (not per_token or not out.output_ids_delta) and echo is None \
            and (call.kind != "chat" or st.started):
        return None
    c: dict[str, Any] = {"index": k}
    if call.kind == "completion":
        if echo is not None:
            delta = echo + delta
        c["text"] = delta
        c["logprobs"] = completion_logprobs(out, st.sent_chars, call.token_text, call.sub.top_logprobs, echo) if call.logprobs else None
        if call.token_ids:
            c["token_ids"] = out.output_ids_delta
        st.started = True
    else:
        d: dict[str, Any] = {} if st.started else {"role": "assistant"}
        if echo is not None:
            delta = echo + delta
        if delta or not st.started:
            d["content"] = delta
        c["delta"] = d
        c["logprobs"] = chat_logprobs(out, call.token_text, call.sub.top_logprobs) if call.logprobs else None
        if call.token_ids:
            c["token_ids"] = out.output_ids_delta
        st.started = True
    c["finish_reason"] = fr
    c["matched_stop"] = out.matched_stop if fr is not None else None
    st.sent_chars += len(delta)
    return c


def _tool_delta_chunk(call: Call, k: int, out: ReqOutput, st: ChoiceState, tools: ToolCallStream) -> dict[str, Any] | None:
    """A chat chunk when tools were declared: content deltas, each complete call as one tool_calls delta, and
    ``finish_reason: "tool_calls"`` when the choice called a function."""
    fr = out.finish_type
    first = tools.num_calls
    content, calls = tools.feed(call.clean(out.text_delta))
    if fr is not None:
        content += tools.flush()
    if not st.started:  # vLLM's chat echo: the final assistant message's text first
        content = (call.echo_of(k) or "") + content
    if not content and not calls and fr is None and (not call.logprobs or not out.output_ids_delta) and st.started:
        return None
    d: dict[str, Any] = {} if st.started else {"role": "assistant"}
    if content or not st.started:
        d["content"] = content
    if calls:
        d["tool_calls"] = [tool_call_dict(c, first + i) for i, c in enumerate(calls)]
    st.started = True
    c: dict[str, Any] = {"index": k, "delta": d,
                         "logprobs": chat_logprobs(out, call.token_text, call.sub.top_logprobs) if call.logprobs else None}
    if call.token_ids:
        c["token_ids"] = out.output_ids_delta
    c["finish_reason"] = "tool_calls" if fr is not None and fr != "abort" and tools.num_calls else fr
    c["matched_stop"] = out.matched_stop if fr is not None else None
    return c
