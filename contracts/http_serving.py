"""Issue 8 (HTTP server): serving behaviour under load and client disconnects (``needs={"http"}``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from contracts.base import contract, require, violation
from contracts.http_support import (
    ARGV_OFF,
    TIMEOUT,
    get_json,
    metrics,
    post,
    prompt_ids,
)

SOURCE = "issue 8 (HTTP server)"
NUM_CLIENTS = 32
NUM_PROMPTS = 8
NEW_TOKENS = 4


def _body(i: int) -> dict[str, Any]:
    sp = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    return {"input_ids": prompt_ids(100 + i, 5 + 2 * i), "sampling_params": sp}


async def _stream_all(url: str, bodies: list[dict[str, Any]]) -> list[list[int] | str]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:

        async def one(body: dict[str, Any]) -> list[int] | str:
            last = None
            async with client.stream("POST", url + "/generate", json={**body, "stream": True}) as r:
                if r.status_code != 200:
                    return f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        last = json.loads(line[6:])
            if last is None or last["meta_info"]["finish_reason"] is None:
                return f"stream ended without a final event (last: {last})"
            return last["output_ids"]

        return list(await asyncio.gather(*(one(b) for b in bodies)))


@contract(
    "HTTP-CONCURRENT-STREAMS",
    f"{NUM_CLIENTS} concurrent streaming clients all complete, each with the same greedy output ids as the same "
    "prompt run alone, and the server batches them (far fewer forwards than generated tokens).",
    SOURCE,
    rules=("H5",),
    needs=("http",),
)
def concurrent_streams(subject) -> None:
    url = subject.base_url(ARGV_OFF)
    expected = []
    for i in range(NUM_PROMPTS):
        r = post(url, "/generate", _body(i))
        require(r.status_code == 200, f"sequential request {i} answered {r.status_code}: {r.text[:200]}")
        expected.append(r.json()["output_ids"])
    forwards_before = get_json(url, "/get_server_info").get("work_counters", {}).get("forwards")
    bodies = [_body(k % NUM_PROMPTS) for k in range(NUM_CLIENTS)]
    got = asyncio.run(_stream_all(url, bodies))
    wrong = [(k, g, expected[k % NUM_PROMPTS]) for k, g in enumerate(got) if g != expected[k % NUM_PROMPTS]]
    require(not wrong, f"{len(wrong)} of {NUM_CLIENTS} concurrent streams differ from the sequential greedy "
                            f"output (client, got, expected): {wrong[:3]}")
    forwards_after = get_json(url, "/get_server_info").get("work_counters", {}).get("forwards")
    if forwards_before is not None and forwards_after is not None:
        used, tokens = forwards_after - forwards_before, NUM_CLIENTS * NEW_TOKENS
        require(used <= tokens // 2, f"{NUM_CLIENTS} concurrent requests took {used} forwards for {tokens} tokens: "
                                          "they were not batched together")


def _state(url: str) -> tuple[int, float, float]:
    """(running + waiting requests, KV token usage, aborted requests so far)."""
    m = metrics(url)
    return (int(m["sglang:num_running_reqs"] + m["sglang:num_queue_reqs"]), m["sglang:token_usage"],
            m["sglang:num_aborted_requests_total"])


def _wait_aborted(url: str, aborted_before: float, seconds: float) -> tuple[int, float, float]:
    """Poll until one more request was aborted and nothing runs (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    state = _state(url)
    while (state[0] or state[2] <= aborted_before) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = _state(url)
    return state


@contract(
    "HTTP-DISCONNECT-ABORTS",
    "A client that disconnects (mid-stream, or while waiting for a non-streamed answer) aborts its request: within "
    "seconds it is counted as aborted, nothing runs and no KV slot is held for it, and the server keeps serving.",
    SOURCE,
    rules=("H6",),
    needs=("http",),
)
def disconnect_aborts(subject) -> None:
    url = subject.base_url(ARGV_OFF)
    ctx = int(get_json(url, "/get_model_info")["context_length"])
    long = {"input_ids": prompt_ids(7, 6), "sampling_params": {"temperature": 0.0, "max_new_tokens": ctx - 8,
                                                                "ignore_eos": True}}
    busy, _, aborted = _state(url)
    require(busy == 0, "the server must be idle before the disconnect test")
    with httpx.stream("POST", url + "/generate", json={**long, "stream": True}, timeout=TIMEOUT) as r:
        require(r.status_code == 200, f"streaming /generate answered {r.status_code}")
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events >= 2:
                break  # leaving the block closes the connection mid-stream
    busy, usage, now = _wait_aborted(url, aborted, 5)
    require(now == aborted + 1 and busy == 0, f"5 s after a streaming client disconnected: {busy} request(s) run, "
                                                  f"aborted count went {aborted} -> {now}; the request was not aborted")
    require(usage == 0.0, f"after the abort the KV pool should hold no live request, token_usage={usage}")
    try:  # a short wait: a fast replica (--dp-size, a core of its own) decodes the ~500 tokens in about 1 s
        r = httpx.post(url + "/generate", json=long, timeout=httpx.Timeout(0.25, connect=10.0))
        raise violation(f"the {ctx - 8}-token request finished within 0.25 s ({r.status_code}), before the "
                             "client could disconnect; nothing was tested")
    except httpx.TimeoutException:
        pass  # the client gave up: the connection is closed
    busy, usage, after = _wait_aborted(url, now, 5)
    require(after == now + 1 and busy == 0, f"5 s after a non-streaming client disconnected: {busy} request(s) "
                                                 f"run, aborted count went {now} -> {after}")
    r = post(url, "/generate", {"input_ids": prompt_ids(8, 4), "sampling_params": {"max_new_tokens": 1}})
    require(r.status_code == 200, f"the server must keep serving after disconnects; got {r.status_code}")
