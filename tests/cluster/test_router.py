"""Two workers behind the real ``sglang-router`` (the ``cluster`` extra), all on loopback.

Worker A is a plain server; worker B runs ``--dp-size 2`` (two replicas behind
its front). Router 1 (round_robin) carries the HTTP contracts and the kill
tests; router 2 (power_of_two) picks by the workers' ``/get_load``; router 3
runs cache_aware with ``--dp-aware`` (it registers B's ranks from ``dp_size`` in
B's ``/server_info`` and pins requests with ``data_parallel_rank``). One set of processes
serves the whole module (starting them is the expensive part); the tests run
in file order, and the last two kill worker B (SIGKILL) and then worker A
(SIGTERM).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import pytest

from contracts.adapters.http_adapter import HttpSubject
from contracts.base import all_contracts
from contracts.http_support import ARGV_OFF, metrics, prompt_ids
from impl.launch_cluster import START_TIMEOUT_S, free_port, router_available, router_argv, spawn, wait_router, worker_argv

why = router_available()
if why:  # CI installs the extra; elsewhere say why these tests did not run
    pytest.skip(f"router tests skipped: {why}", allow_module_level=True)

ROUTER_FLAGS = ["--health-check-interval-secs", "2", "--worker-startup-timeout-secs", "300"]
THROUGH_ROUTER = ("H1", "H2", "H3", "H4", "H5", "H9")
ON_DP_WORKER = ("H1", "H2", "H3", "H4", "H5", "H6", "H7", "H8", "H9")  # every HTTP contract, on --dp-size 2
LONG = {"temperature": 0.0, "ignore_eos": True}


class Cluster:
    def __init__(self) -> None:
        self.a = spawn("worker A", worker_argv(ARGV_OFF), None)
        self.b = spawn("worker B", worker_argv([*ARGV_OFF, "--dp-size", "2"]), None)
        self.router = self.router2 = self.router3 = None
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            self.url_a, self.url_b = self.a.wait_ready(deadline), self.b.wait_ready(deadline)
            workers = [self.url_a, self.url_b]
            port, port2, port3 = free_port(), free_port(), free_port()
            self.router = spawn("router", router_argv(workers, "127.0.0.1", port, "round_robin", ROUTER_FLAGS), None)
            self.router2 = spawn("router 2", router_argv(workers, "127.0.0.1", port2, "power_of_two", ROUTER_FLAGS),
                                 None)
            self.router3 = spawn("router 3", router_argv(workers, "127.0.0.1", port3, "cache_aware",
                                                         [*ROUTER_FLAGS, "--dp-aware"]), None)
            self.url, self.url2, self.url3 = (f"http://127.0.0.1:{p}" for p in (port, port2, port3))
            wait_router(self.url, self.router, 2, deadline)
            wait_router(self.url2, self.router2, 2, deadline)
            wait_router(self.url3, self.router3, 3, deadline)  # A, and B's two data-parallel ranks
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for child in (self.router, self.router2, self.router3, self.a, self.b):
            if child is not None:
                child.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def _contract(rule: str):
    (c,) = [c for c in all_contracts() if "http" in c.needs and rule in c.rules]
    return c


@pytest.mark.parametrize("rule", THROUGH_ROUTER)
def test_http_contracts_through_the_router(cluster, rule):
    _contract(rule).run(HttpSubject(cluster.url))


@pytest.mark.parametrize("rule", ON_DP_WORKER)
def test_http_contracts_on_the_dp2_worker(cluster, rule):
    _contract(rule).run(HttpSubject(cluster.url_b))


def test_both_workers_got_traffic(cluster):
    for url in (cluster.url_a, cluster.url_b):  # the contracts' traffic, round-robin over A and B
        assert metrics(url)["sglang:prompt_tokens_total"] > 0, url


def test_dp_aware_registration_and_chat_without_model(cluster):
    workers = httpx.get(cluster.url3 + "/workers", timeout=10).json()["workers"]
    urls = sorted(w["url"] for w in workers)
    assert urls == sorted([f"{cluster.url_a}@0", f"{cluster.url_b}@0", f"{cluster.url_b}@1"]), urls
    before = [r["requests_served"] for r in httpx.get(cluster.url_b + "/get_server_info").json()["dp_ranks"]]
    for i in range(6):  # the router fills the missing model with "unknown"
        r = httpx.post(cluster.url3 + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2
    after = [r["requests_served"] for r in httpx.get(cluster.url_b + "/get_server_info").json()["dp_ranks"]]
    assert sum(after) >= sum(before), (before, after)


async def _run_all(url: str, bodies: list[dict[str, Any]], during=None) -> list[int | str]:
    """POST every body to /generate at once; ``during()`` runs once they are all sent. Status per request."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0)) as client:

        async def one(body: dict[str, Any]) -> int | str:
            try:
                r = await client.post(url + "/generate", json=body)
                return r.status_code if r.status_code != 200 else len(r.json()["output_ids"])
            except httpx.HTTPError as e:
                return type(e).__name__

        tasks = [asyncio.create_task(one(b)) for b in bodies]
        if during is not None:
            await during()
        return list(await asyncio.gather(*tasks))


def _load(url: str) -> list[dict[str, int]]:
    return httpx.get(url + "/get_load", timeout=10).json()


def test_get_load_follows_load(cluster):
    idle = _load(cluster.url_b)
    assert [e["dp_rank"] for e in idle] == [0, 1] and all(e["num_reqs"] == e["num_waiting_reqs"] == 0 for e in idle)
    seen: dict[str, Any] = {}

    async def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen.get("busy"):
            loads = _load(cluster.url_a) + _load(cluster.url_b)
            router = httpx.get(cluster.url2 + "/get_loads", timeout=10).json()["workers"]
            if any(e["num_reqs"] + e["num_waiting_reqs"] > 0 and e["num_tokens"] > 0 for e in loads) and \
                    any(w["load"] > 0 for w in router):
                seen.update(busy=loads, router=router)
            await asyncio.sleep(0.05)

    bodies = [{"input_ids": prompt_ids(40 + i, 24), "sampling_params": {**LONG, "max_new_tokens": 48}} for i in range(6)]
    got = asyncio.run(_run_all(cluster.url2, bodies, watch))  # power_of_two: it picks by these loads
    assert got == [48] * 6
    assert seen.get("busy"), "no worker's /get_load (and the router's /get_loads) showed the running requests"
    assert all(w["load"] >= 0 for w in seen["router"])
    after = _load(cluster.url_a) + _load(cluster.url_b)
    assert all(e["num_reqs"] == e["num_waiting_reqs"] == 0 for e in after), after


def _wait_until(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _healthy(router: str, worker: str) -> bool:
    workers = httpx.get(router + "/workers", timeout=10).json()["workers"]
    return any(w["url"] == worker and w.get("is_healthy", True) for w in workers)


def test_sigkill_of_a_worker_loses_only_its_in_flight_requests(cluster):
    bodies = [{"input_ids": prompt_ids(60 + i, 16), "sampling_params": {**LONG, "max_new_tokens": 64}}
              for i in range(9)]
    in_flight_on_b: list[int] = []

    async def kill_b() -> None:
        busy = lambda: sum(e["num_reqs"] + e["num_waiting_reqs"] for e in _load(cluster.url_b))  # noqa: E731
        assert await asyncio.to_thread(_wait_until, lambda: busy() > 0), "worker B never got a request"
        in_flight_on_b.append(busy())
        os.kill(cluster.b.proc.pid, signal.SIGKILL)

    got = asyncio.run(_run_all(cluster.url, bodies, kill_b))
    lost = [g for g in got if g != 64]
    assert len(lost) <= in_flight_on_b[0], f"{len(lost)} requests lost, {in_flight_on_b[0]} were on worker B: {got}"
    assert len(got) - len(lost) >= len(bodies) - in_flight_on_b[0]
    # B's replicas follow their front; the router's health check marks B down; then it serves from A alone
    assert _wait_until(lambda: cluster.b.proc.poll() is not None)
    assert _wait_until(lambda: not _healthy(cluster.url, cluster.url_b), 60), "the router never marked B unhealthy"
    after = asyncio.run(_run_all(cluster.url, [{"input_ids": prompt_ids(80 + i, 8),
                                                "sampling_params": {**LONG, "max_new_tokens": 4}} for i in range(4)]))
    assert after == [4] * 4, after


def test_sigterm_of_a_worker_loses_nothing(cluster):
    bodies = [{"input_ids": prompt_ids(90 + i, 12), "sampling_params": {**LONG, "max_new_tokens": 24}}
              for i in range(4)]

    async def term_a() -> None:
        busy = lambda: sum(e["num_reqs"] + e["num_waiting_reqs"] for e in _load(cluster.url_a))  # noqa: E731
        assert await asyncio.to_thread(_wait_until, lambda: busy() == len(bodies)), "the requests never reached A"
        cluster.a.proc.send_signal(signal.SIGTERM)

    got = asyncio.run(_run_all(cluster.url, bodies, term_a))
    assert got == [24] * len(bodies), got
    assert cluster.a.proc.wait(30) == 0
