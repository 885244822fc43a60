"""Soak (issue 14, item 5c): many concurrent streaming clients, disconnects, aborts and flushes; nothing breaks.

Clients stream over ``/generate``, ``/v1/completions`` and ``/v1/chat/completions`` (some with ``n = 2``),
greedy, for a fixed number of requests. A share of them disconnect mid-stream, abort their own request by
rid, or flush the cache. Afterwards: no 5xx, every stream that was not cut exactly one finish reason per
choice and ``[DONE]``, greedy texts equal to a sequential run (aborted ones a prefix of it), KV free, the
idle integrity check clean (/health 200), server RSS growth below ``RSS_BOUND_MB``.

CI runs ``test_soak_reduced``; ``make soak`` runs ``test_soak_full`` (64 clients) and the other soak tests.
Loopback only.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import httpx
import pytest

from contracts.http_support import SSE, TIMEOUT

RSS_BOUND_MB = 200.0


def _templates() -> list[tuple[str, dict]]:
    g = {"temperature": 0.0, "ignore_eos": True}
    o = {"temperature": 0.0, "ignore_eos": True}
    return [
        ("/generate", {"input_ids": [20 + i for i in range(6)], "sampling_params": {**g, "max_new_tokens": 10}}),
        ("/generate", {"text": "The sea is", "sampling_params": {**g, "max_new_tokens": 8, "n": 2}}),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, **o}),
        ("/v1/completions", {"prompt": [30, 31, 32, 33], "max_tokens": 6, "n": 2, **o}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, **o}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell a story"}], "max_tokens": 7, "n": 2,
                                  **o}),
    ]


def _choice_texts(route: str, body: dict) -> list[str]:
    if route == "/generate":
        return [body["text"]] if isinstance(body, dict) else [x["text"] for x in body]
    return [c["text"] if route == "/v1/completions" else c["message"]["content"] for c in body["choices"]]


@dataclass
class Stream:
    texts: dict[int, str] = field(default_factory=dict)
    finishes: dict[int, int] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    sse: SSE = field(default_factory=SSE)  # the stream's framing: [DONE], events after it
    errors: list = field(default_factory=list)
    events: int = 0

    def add(self, route: str, ev: dict) -> None:
        self.events += 1
        if "error" in ev:
            self.errors.append(ev)
            return
        if route == "/generate":
            i = ev.get("index", 0)
            self.texts[i] = ev["text"]
            fr = ev["meta_info"]["finish_reason"]
            if fr is not None:
                self.finishes[i] = self.finishes.get(i, 0) + 1
                self.reasons[i] = fr["type"]
            return
        for c in ev.get("choices", []):
            i = c["index"]
            piece = c.get("text") if route == "/v1/completions" else (c.get("delta") or {}).get("content")
            self.texts[i] = self.texts.get(i, "") + (piece or "")
            if c["finish_reason"] is not None:
                self.finishes[i] = self.finishes.get(i, 0) + 1
                self.reasons[i] = c["finish_reason"]


@dataclass
class SoakReport:
    requests: int = 0
    completed: int = 0
    aborted: int = 0
    disconnected: int = 0
    flushes: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


async def _one(client: httpx.AsyncClient, url: str, route: str, body: dict, rid: str, action: str, ref: list[str],
               rep: SoakReport, rng: random.Random) -> None:
    body = {**body, "stream": True, "rid": rid}
    st = Stream()
    cut_after = rng.randint(1, 3)
    async with client.stream("POST", url + route, json=body) as r:
        rep.statuses[r.status_code] = rep.statuses.get(r.status_code, 0) + 1
        if r.status_code != 200:
            await r.aread()
            rep.problems.append(f"{route} {rid}: status {r.status_code}: {r.text[:200]}")
            return
        async for line in r.aiter_lines():
            ev = st.sse.feed(line)
            if ev is None:
                continue
            st.add(route, ev)
            if action == "disconnect" and st.events >= cut_after:
                rep.disconnected += 1
                return  # leaving the block closes the connection mid-stream
            if action == "abort" and st.events == cut_after:
                a = await client.post(url + "/abort_request", json={"rid": rid})
                if a.status_code != 200:
                    rep.problems.append(f"abort {rid}: {a.status_code} {a.text[:200]}")
    n = len(ref)
    if not st.sse.done or st.sse.after_done or st.errors:
        rep.problems.append(f"{route} {rid}: done={st.sse.done} after_done={st.sse.after_done} errors={st.errors[:1]}")
        return
    if sorted(st.finishes) != list(range(n)) or set(st.finishes.values()) != {1}:
        rep.problems.append(f"{route} {rid}: finish reasons per choice {st.finishes}, expected one for each of {n}")
        return
    texts = [st.texts.get(i, "") for i in range(n)]
    if action == "abort" and "abort" in st.reasons.values():
        rep.aborted += 1
        bad = [i for i in range(n) if not ref[i].startswith(texts[i])]
    else:
        rep.completed += 1
        bad = [i for i in range(n) if texts[i] != ref[i]]
    if bad:
        rep.problems.append(f"{route} {rid} ({action}): texts {[texts[i] for i in bad]} vs sequential "
                            f"{[ref[i] for i in bad]}")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def soak(url: str, clients: int, total: int, seed: int = 14) -> SoakReport:
    templates = _templates()
    rep = SoakReport()
    limits = httpx.Limits(max_connections=clients * 2 + 8, max_keepalive_connections=clients * 2 + 8)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        refs = []
        for route, body in templates:  # the sequential run
            r = await client.post(url + route, json=body)
            assert r.status_code == 200, r.text
            refs.append(_choice_texts(route, r.json()))
        counter = iter(range(total))

        async def worker(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            for i in counter:
                k = rng.randrange(len(templates))
                route, body = templates[k]
                roll = rng.random()
                if roll < 0.05:
                    f = await client.post(url + "/flush_cache")
                    rep.statuses[f.status_code] = rep.statuses.get(f.status_code, 0) + 1
                    rep.flushes += 1
                    if f.status_code not in (200, 400):
                        rep.problems.append(f"flush_cache: {f.status_code}")
                    continue
                action = "disconnect" if roll < 0.20 else ("abort" if roll < 0.32 else "full")
                rep.requests += 1
                await _one(client, url, route, body, f"soak-{seed}-{c}-{i}", action, refs[k], rep, rng)

        await asyncio.gather(*(worker(c) for c in range(clients)))
        deadline = time.monotonic() + 60
        while True:
            info = (await client.get(url + "/get_server_info")).json()
            if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
                break
            if time.monotonic() > deadline:
                rep.problems.append(f"server not idle 60 s after the soak: {info['num_running_reqs']} running")
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the idle integrity check runs on the transition to idle
        info = (await client.get(url + "/get_server_info")).json()
        if info["token_usage"] != 0.0:
            rep.problems.append(f"KV not free after the soak: token_usage {info['token_usage']}")
        h = await client.get(url + "/health")
        if h.status_code != 200:
            rep.problems.append(f"/health after the soak: {h.status_code} {h.text[:300]}")
    return rep


def _run(server, clients: int, total: int) -> SoakReport:
    before = rss_mb(server.proc.pid)
    t = time.perf_counter()
    rep = asyncio.run(soak(server.url, clients, total))
    growth = rss_mb(server.proc.pid) - before
    print(f"soak: {clients} clients, {rep.requests} requests ({rep.completed} completed, {rep.aborted} aborted, "
          f"{rep.disconnected} disconnected, {rep.flushes} flushes) in {time.perf_counter() - t:.1f}s; "
          f"statuses {rep.statuses}; RSS growth {growth:.0f} MB")
    assert not [s for s in rep.statuses if s >= 500], rep.statuses
    assert not rep.problems, "\n".join(rep.problems[:20])
    assert rep.completed > 0 and rep.disconnected > 0
    assert growth < RSS_BOUND_MB, f"server RSS grew {growth:.0f} MB (bound {RSS_BOUND_MB:.0f} MB)"
    return rep


def test_soak_reduced(hardened):
    _run(hardened, clients=12, total=60)


@pytest.mark.soak
def test_soak_full(hardened):
    _run(hardened, clients=64, total=1500)
