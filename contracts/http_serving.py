"""Issue 8 (HTTP server): serving behaviour under load and client disconnects (``needs={"http"}``)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from contracts.base import contract, inconclusive, note, require, violation
from contracts.http_dialect import ServerAnswer, ServerApi, complete, discover, scrape, stream_body, total
from contracts.http_support import ARGV_OFF, TIMEOUT, get_json, prompt_ids
from contracts.sse_client import asse_lines

SOURCE = "issue 8 (HTTP server)"
NUM_CLIENTS = 32
NUM_PROMPTS = 8
NEW_TOKENS = 4


def _prompt(i: int) -> list[int]:
    return prompt_ids(100 + i, 5 + 2 * i)


async def _stream_all(api: ServerApi, prompts: list[list[int]]) -> list[list[int] | str]:
    """Stream every prompt at once; each result is the output (token ids, else the text) or an error string."""
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:

        async def one(prompt: list[int]) -> list[int] | str:
            path, body = stream_body(api, prompt, NEW_TOKENS)
            last, text, ids, reason = None, "", [], None
            async with client.stream("POST", api.url + path, json=body) as r:
                if r.status_code != 200:
                    return f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                async for line in asse_lines(r.aiter_text()):
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    last = json.loads(line[5:])
                    if api.native:
                        ids, reason = last["output_ids"], last["meta_info"]["finish_reason"]
                    for ch in last.get("choices") or []:
                        text += ch.get("text") or ""
                        ids += ch.get("token_ids") or []
                        reason = ch.get("finish_reason") or reason
            if last is None or reason is None:
                return f"stream ended without a final event (last: {last})"
            return ids if (api.native or api.token_ids) else text

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def _forwards(api: ServerApi) -> float | None:
    """Engine steps so far: this project's work counters, else the server's own step histogram."""
    if api.native:
        info = get_json(api.url, "/get_server_info") if api.server_info is not None else {}
        return info.get("work_counters", {}).get("forwards")
    if api.metrics is not None and api.metrics.forwards is not None:
        return total(scrape(api.url), api.metrics.forwards + "_count")
    return None


@contract(
    "HTTP-CONCURRENT-STREAMS", SOURCE, rules=("H5",), needs=("http",),
    rule=f"{NUM_CLIENTS} concurrent streaming clients all complete, each with the same greedy output ids as the same "
    "prompt run alone, and the server batches them (far fewer forwards than generated tokens).",
)
def concurrent_streams(subject) -> None:
    api = discover(subject.base_url(ARGV_OFF))
    expected = []
    for i in range(NUM_PROMPTS):
        try:
            out = complete(api, _prompt(i), NEW_TOKENS)
        except ServerAnswer as e:
            raise violation(f"sequential request {i}: {e}") from None
        expected.append(out.ids if out.ids is not None else out.text)
    if not (api.native or api.token_ids):
        note("the server returns no output token ids: greedy outputs compared as text")
    forwards_before = _forwards(api)
    got = asyncio.run(_stream_all(api, [_prompt(k % NUM_PROMPTS) for k in range(NUM_CLIENTS)]))
    wrong = [(k, g, expected[k % NUM_PROMPTS]) for k, g in enumerate(got) if g != expected[k % NUM_PROMPTS]]
    require(not wrong, f"{len(wrong)} of {NUM_CLIENTS} concurrent streams differ from the sequential greedy "
                       f"output (client, got, expected): {wrong[:3]}")
    forwards_after = _forwards(api)
    if forwards_before is not None and forwards_after is not None:
        used, tokens = forwards_after - forwards_before, NUM_CLIENTS * NEW_TOKENS
        require(used <= tokens // 2, f"{NUM_CLIENTS} concurrent requests took {used} forwards for {tokens} tokens: "
                                     "they were not batched together")
    else:
        note("the server exports no count of engine steps: batching not checked")


@dataclass(frozen=True)
class _Load:
    """What the server's own metrics say at one moment."""

    busy: int  # running + waiting requests
    kv_usage: float
    aborted: float | None  # aborted requests so far, None where no counter says
    generated: float  # output tokens so far


def _state(api: ServerApi) -> _Load:
    names = api.metrics
    assert names is not None, "the contract refuses a server without metrics before it reads them"
    m = scrape(api.url)
    busy = (total(m, names.running) or 0) + (total(m, names.waiting) or 0)
    aborted = (total(m, names.aborted[0], **names.aborted[1]) or 0.0) if names.aborted else None
    return _Load(int(busy), total(m, names.kv_usage) or 0.0, aborted, total(m, names.generation_tokens) or 0.0)


def _wait_aborted(api: ServerApi, before: _Load, seconds: float) -> _Load:
    """Poll until one more request was aborted (where counted) and nothing runs (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    state = _state(api)
    while (state.busy or (state.aborted is not None and state.aborted <= (before.aborted or 0))) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
        state = _state(api)
    return state


def _abort_problems(how: str, before: _Load, after: _Load, asked: int) -> list[str]:
    """What the metrics show wrong once a client disconnected from a request for ``asked`` tokens (none: all well)."""
    made = int(after.generated - before.generated)
    if after.busy:
        return [f"5 s after a {how} client disconnected: {after.busy} request(s) still run ({made} of {asked} "
                "tokens generated so far); the request was not aborted"]
    problems = []
    if after.aborted is not None and after.aborted != (before.aborted or 0) + 1:
        problems.append(f"5 s after a {how} client disconnected: nothing runs and the request stopped after {made} of "
                        f"{asked} tokens, but the aborted count went {before.aborted} -> {after.aborted}: the abort "
                        "was not counted")
    if after.kv_usage != 0.0:
        problems.append(f"after the {how} client's abort the KV pool should hold no live request, "
                        f"KV usage={after.kv_usage}")
    return problems


@contract("HTTP-DISCONNECT-ABORTS", SOURCE, rules=("H6",), needs=("http",))
def disconnect_aborts(subject) -> None:
    """A client that disconnects (mid-stream, or while waiting for a non-streamed answer) aborts its request: within
    seconds it is counted as aborted, nothing runs and no KV slot is held for it, and the server keeps serving
    (observed through the server's own running-requests, KV-usage and aborted-requests metrics)."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    if api.metrics is None:
        raise violation(f"{url}/metrics shows no running-requests gauge in a known family's names (sglang:*, vllm:*): "
                        "the server gives no way to see that an abort stopped the request", project=True)
    ctx = int(api.context_length or 0)
    if not ctx:
        raise inconclusive(f"{url} reports no context length: no request long enough to disconnect from")
    if api.metrics.aborted is None:
        note("the server counts no aborted requests: the abort is observed as nothing running")
    path, body = stream_body(api, prompt_ids(7, 6), ctx - 8)
    before = _state(api)
    require(before.busy == 0, "the server must be idle before the disconnect test")
    with httpx.stream("POST", url + path, json=body, timeout=TIMEOUT) as r:
        require(r.status_code == 200, f"streaming {path} answered {r.status_code}")
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data:")
            if events >= 2:
                break  # leaving the block closes the connection mid-stream
    now = _wait_aborted(api, before, 5)
    problems = _abort_problems("streaming", before, now, ctx - 8)  # every phase is checked, then all are reported
    require(now.busy == 0, "; ".join(problems))  # a request still running would skew the next phase
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:  # a short wait: a fast replica (--dp-size, a core of its own) decodes the ~500 tokens in about 1 s
        r = httpx.post(url + path, json=body, timeout=httpx.Timeout(0.25, connect=10.0))
        raise violation(f"the {ctx - 8}-token request finished within 0.25 s ({r.status_code}), before the "
                        "client could disconnect; nothing was tested")
    except httpx.TimeoutException:
        pass  # the client gave up: the connection is closed
    after = _wait_aborted(api, now, 5)
    problems += _abort_problems("non-streaming", now, after, ctx - 8)
    try:
        complete(api, prompt_ids(8, 4), 1)
    except ServerAnswer as e:
        problems.append(f"the server must keep serving after disconnects: {e}")
    require(not problems, "\n  ".join(problems))
