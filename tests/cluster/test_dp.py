"""``--dp-size 2`` on its own: per-rank startup log and /get_load behind --api-key, shortest-queue dispatch,
a replica killed mid-run (its requests fail cleanly, /health says 503 naming it, the other rank serves),
and SIGTERM of the front. One server for the module; the replica-kill test comes last but one."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from contracts.adapters.impl_http import start
from contracts.http_support import ARGV_OFF, prompt_ids

KEY = "dp-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    s = start([*ARGV_OFF, "--dp-size", "2", "--load-balance-method", "shortest_queue", "--api-key", KEY])
    yield s
    s.stop()


def _info(url: str) -> dict:
    return httpx.get(url + "/get_server_info", headers=AUTH, timeout=30).json()


def test_startup_log_names_each_rank_and_get_load_needs_the_key(server):
    log = server.log()
    for rank in (0, 1):
        assert f"Data-parallel rank {rank}: pid" in log and f"Data-parallel rank {rank} ready" in log
        assert f"[DP{rank}] Model " in log  # each replica's own engine lines carry its rank
    assert "2 data-parallel replicas ready; dispatch: shortest_queue" in log
    assert httpx.get(server.url + "/get_load").status_code == 401
    loads = httpx.get(server.url + "/get_load", headers=AUTH).json()
    assert loads == [{"dp_rank": r, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0} for r in (0, 1)]
    info = _info(server.url)
    assert info["dp_size"] == 2 and info["api_key"] == "<redacted>" and len(info["dp_ranks"]) == 2
    assert len({tuple(r["cores"]) for r in info["dp_ranks"]}) == min(2, len(os.sched_getaffinity(0)))


async def _post(client: httpx.AsyncClient, url: str, body: dict, stream: bool = False):
    if not stream:
        r = await client.post(url + "/generate", json=body, headers=AUTH)
        return r.status_code, r.json()
    async with client.stream("POST", url + "/generate", json={**body, "stream": True}, headers=AUTH) as r:
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        return r.status_code, lines


def test_shortest_queue_sends_work_to_the_idle_rank(server):
    before = [r["requests_served"] for r in _info(server.url)["dp_ranks"]]

    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            long = asyncio.create_task(_post(c, server.url, {"input_ids": prompt_ids(1, 8),
                                                             "sampling_params": {**GREEDY, "max_new_tokens": 400}}))
            while sum(r["in_flight"] for r in _info(server.url)["dp_ranks"]) == 0:
                await asyncio.sleep(0.02)
            busy_rank = next(r["dp_rank"] for r in _info(server.url)["dp_ranks"] if r["in_flight"])
            for i in range(3):
                code, _ = await _post(c, server.url, {"input_ids": prompt_ids(2 + i, 4),
                                                      "sampling_params": {**GREEDY, "max_new_tokens": 2}})
                assert code == 200
            assert (await long)[0] == 200
            return busy_rank

    busy = asyncio.run(run())
    after = [r["requests_served"] for r in _info(server.url)["dp_ranks"]]
    assert after[busy] - before[busy] == 1 and after[1 - busy] - before[1 - busy] == 3, (before, after)


def test_a_dead_replica_fails_its_requests_cleanly_and_health_says_so(server):
    pid1 = _info(server.url)["dp_ranks"][1]["pid"]
    body = {"sampling_params": {**GREEDY, "max_new_tokens": 400}}

    async def run():
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = [asyncio.create_task(_post(c, server.url, {**body, "input_ids": prompt_ids(10 + i, 8)}, i >= 2))
                     for i in range(4)]
            while sum(r["num_reqs"] + r["num_waiting_reqs"]
                      for r in httpx.get(server.url + "/get_load", headers=AUTH).json()) < 4:
                await asyncio.sleep(0.02)
            os.kill(pid1, signal.SIGKILL)
            t0 = time.monotonic()
            out = await asyncio.gather(*tasks)
            return out, time.monotonic() - t0

    out, took = asyncio.run(run())
    assert took < 30  # nothing hangs
    plain_ok = [o for o in out[:2] if o[0] == 200 and o[1]["meta_info"]["completion_tokens"] == 400]
    plain_lost = [o[1]["error"]["message"] for o in out[:2] if o[0] == 503]
    stream_ok = [o for o in out[2:] if o[0] == 200 and o[1][-1] == "data: [DONE]" and '"error"' not in o[1][-2]]
    stream_lost = [o[1][-2] for o in out[2:] if o[0] == 200 and o[1][-1] == "data: [DONE]" and '"error"' in o[1][-2]]
    # shortest_queue put two of the four on rank 1: exactly those are lost, each with an error naming the rank
    assert len(plain_ok) + len(stream_ok) == 2 and len(plain_lost) + len(stream_lost) == 2, out
    assert all("data-parallel rank 1" in m and "exited" in m for m in plain_lost + stream_lost), out
    h = httpx.get(server.url + "/health")
    assert h.status_code == 503 and "data-parallel rank 1" in h.json()["error"]["message"]
    code, again = asyncio.run(_once(server.url))
    assert code == 200 and again["meta_info"]["completion_tokens"] == 2  # rank 0 keeps serving
    assert [e["dp_rank"] for e in httpx.get(server.url + "/get_load", headers=AUTH).json()] == [0]


async def _once(url: str):
    async with httpx.AsyncClient(timeout=60) as c:
        return await _post(c, url, {"input_ids": prompt_ids(30, 4), "sampling_params": {**GREEDY, "max_new_tokens": 2}})


def test_sigterm_stops_the_front_and_the_replicas(server):
    pids = [r["pid"] for r in _info(server.url)["dp_ranks"]]
    assert server.stop() == 0
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
