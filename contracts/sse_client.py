"""Streaming HTTP clients for SGLang's native route and the OpenAI routes, timed as SGLang's bench_serving
times them. The contracts use them to time servers by URL (``contracts.adapters.http_adapter``); the serving
benchmark (``bench/serving``) registers them as its backends.

Every request function streams one request and returns a ``RequestFuncOutput``:

* ``ttft``: seconds from sending the request to the first chunk that carries text;
* ``itl``: seconds between consecutive chunks that carry new text after it;
* ``latency``: seconds from sending to the end of the stream;
* ``output_len``: completion tokens (the server's count when it reports one, else the
  requested length when ``ignore_eos``), ``prompt_len`` likewise;
* ``spec_verify_ct``: SGLang's count of speculative verify passes, when reported
  (accept length = completion tokens / verify passes).

``sglang_generate`` streams native ``/generate`` with ``input_ids``; ``openai_completions``
``/v1/completions`` with token ids as the prompt; ``openai_chat`` ``/v1/chat/completions`` (the
prompt given as text). ``sse_lines`` / ``asse_lines`` split a server-sent event stream into lines.
Only httpx and the standard library: an installed ``contracts`` package runs them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx


@dataclass(frozen=True)
class RequestFuncInput:
    base_url: str
    model: str
    prompt_ids: list[int]
    prompt_len: int
    output_len: int
    prompt_text: str | None = None  # chat: the decoded prompt
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestFuncOutput:
    success: bool = False
    generated_text: str = ""
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    prompt_len: int = 0
    output_len: int = 0
    spec_verify_ct: int | None = None
    error: str = ""
    start_time: float = 0.0  # perf_counter when sent (for the benchmark's duration)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("success", "ttft", "itl", "latency", "prompt_len", "output_len",
                                              "spec_verify_ct", "error")}


RequestFunc = Callable[[httpx.AsyncClient, RequestFuncInput], Awaitable[RequestFuncOutput]]


class _Clock:
    """TTFT at the first chunk with text, then one ITL per later chunk with new text."""

    def __init__(self, out: RequestFuncOutput):
        self.out = out
        self.st = time.perf_counter()
        out.start_time = self.st
        self.last = self.st

    def tick(self) -> None:
        now = time.perf_counter()
        if self.out.ttft == 0.0:
            self.out.ttft = now - self.st
        else:
            self.out.itl.append(now - self.last)
        self.last = now

    def end(self) -> None:
        self.out.latency = time.perf_counter() - self.st


class SSELines:
    """Lines of a server-sent event stream split at "\n" only (SSE's line end; httpx's iter_lines also
    splits at U+0085 / U+2028 / U+2029, which a server may leave raw inside an event's JSON)."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, chunk: str) -> list[str]:
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        return [line.rstrip("\r") for line in lines]

    def rest(self) -> list[str]:
        return [self.buf] if self.buf else []


def sse_lines(chunks):
    """``SSELines`` over an iterator of text chunks (``httpx.Response.iter_text()``)."""
    lines = SSELines()
    for chunk in chunks:
        yield from lines.feed(chunk)
    yield from lines.rest()


async def asse_lines(chunks):
    """``SSELines`` over an async iterator of text chunks (``httpx.Response.aiter_text()``)."""
    lines = SSELines()
    async for chunk in chunks:
        for line in lines.feed(chunk):
            yield line
    for line in lines.rest():
        yield line


async def _events(client: httpx.AsyncClient, url: str, body: dict[str, Any], out: RequestFuncOutput):
    """Yield each SSE event's JSON (None for ``[DONE]``); a non-200 answer is recorded in ``out.error``."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            out.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
            return
        async for line in asse_lines(r.aiter_text()):
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                yield None
                return
            yield json.loads(data)


async def _guard(fn, out: RequestFuncOutput) -> RequestFuncOutput:
    try:
        await fn()
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, ValueError) as e:
        out.success, out.error = False, f"{type(e).__name__}: {e}"
    return out


async def sglang_generate(client: httpx.AsyncClient, inp: RequestFuncInput) -> RequestFuncOutput:
    out = RequestFuncOutput(prompt_len=inp.prompt_len)
    body = {
        "input_ids": inp.prompt_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": inp.output_len, "ignore_eos": inp.ignore_eos},
        "stream": True,
        **inp.extra_body,
    }

    async def run() -> None:
        clock, text = _Clock(out), ""
        async for ev in _events(client, inp.base_url + "/generate", body, out):
            if ev is None:
                break
            if "error" in ev:
                raise ValueError(f"server error event: {ev['error']}")
            new = ev.get("text", "")
            if new and new != text:  # native streams carry the cumulative text
                clock.tick()
                text = new
            meta = ev.get("meta_info", {})
            out.output_len = int(meta.get("completion_tokens", out.output_len))
            out.prompt_len = int(meta.get("prompt_tokens", out.prompt_len))
            if "spec_verify_ct" in meta:
                out.spec_verify_ct = int(meta["spec_verify_ct"])
        clock.end()
        out.generated_text = text
        out.success = not out.error and out.output_len > 0

    return await _guard(run, out)


async def _openai(client: httpx.AsyncClient, inp: RequestFuncInput, chat: bool) -> RequestFuncOutput:
    out = RequestFuncOutput(prompt_len=inp.prompt_len)
    body: dict[str, Any] = {
        "model": inp.model,
        "temperature": 0.0,
        "max_tokens": inp.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": inp.ignore_eos,
        **inp.extra_body,
    }
    if chat:
        if inp.prompt_text is None:
            raise ValueError("the chat backend needs the prompt as text (decode the ids with --tokenizer)")
        body["messages"] = [{"role": "user", "content": inp.prompt_text}]
    else:
        body["prompt"] = inp.prompt_ids
    path = "/v1/chat/completions" if chat else "/v1/completions"

    async def run() -> None:
        clock, pieces, usage = _Clock(out), [], None
        async for ev in _events(client, inp.base_url + path, body, out):
            if ev is None:
                break
            if "error" in ev:
                raise ValueError(f"server error event: {ev['error']}")
            for ch in ev.get("choices") or []:
                delta = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                if delta:
                    clock.tick()
                    pieces.append(delta)
            usage = ev.get("usage") or usage
        clock.end()
        out.generated_text = "".join(pieces)
        if usage:
            out.output_len = int(usage.get("completion_tokens", 0))
            out.prompt_len = int(usage.get("prompt_tokens", out.prompt_len))
        elif inp.ignore_eos:
            out.output_len = inp.output_len
        out.success = not out.error and out.output_len > 0

    return await _guard(run, out)


async def openai_completions(client: httpx.AsyncClient, inp: RequestFuncInput) -> RequestFuncOutput:
    return await _openai(client, inp, chat=False)


async def openai_chat(client: httpx.AsyncClient, inp: RequestFuncInput) -> RequestFuncOutput:
    return await _openai(client, inp, chat=True)
