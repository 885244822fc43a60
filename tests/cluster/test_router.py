"""Two workers behind the real ``sglang-router`` (the ``cluster`` extra), all on loopback.

Six processes, the fewest the behaviour needs: worker A is a plain server; worker
B runs ``--dp-size 2 --load-balance-method shortest_queue`` (a front and two
replicas). The round_robin router carries the HTTP contracts, the loads (its
``/get_loads`` polls every worker's ``/get_load`` whatever the policy) and the kill
tests; the dp-aware router (cache_aware with ``--dp-aware``) registers B's ranks
from ``dp_size`` in B's ``/server_info`` and pins requests with
``data_parallel_rank``; it needs its own process, since a dp-aware router reports
no loads. One set of processes serves the whole module (starting them is the
expensive part), so the tests run in file order and the destructive ones come
last: SIGKILL of A (B serves the rest; A is restarted on its port), a killed
replica of B, SIGTERM of A through the router, SIGTERM of B.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from typing import Any

import httpx
import pytest

from contracts.adapters.http_adapter import HttpSubject
from contracts.base import all_contracts
from contracts.http_support import ARGV_OFF, metrics, prompt_ids
from impl.launch_cluster import START_TIMEOUT_S, free_port, router_available, spawn, start_router, worker_argv

why = router_available()
if why:  # CI installs the extra; elsewhere say why these tests did not run
    pytest.skip(f"router tests skipped: {why}", allow_module_level=True)

ROUTER_FLAGS = ["--health-check-interval-secs", "2", "--worker-startup-timeout-secs", "300"]
THROUGH_ROUTER = ("H1", "H2", "H3", "H4", "H5", "H9")
ON_DP_WORKER = ("H1", "H2", "H3", "H4", "H5", "H6", "H7", "H8", "H9")  # every HTTP contract, on --dp-size 2
LONG = {"temperature": 0.0, "ignore_eos": True}


DP_FLAGS = ["--dp-size", "2", "--load-balance-method", "shortest_queue"]


class Cluster:
    def __init__(self) -> None:
        self.port_a = free_port()  # fixed: A is restarted on it after the SIGKILL test
        self.a = spawn("worker A", worker_argv(ARGV_OFF, self.port_a), None)
        self.b = spawn("worker B", worker_argv([*ARGV_OFF, *DP_FLAGS]), None)
        self.router = self.router_dp = None
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            self.url_a, self.url_b = self.a.wait_ready(deadline), self.b.wait_ready(deadline)
            workers = [self.url_a, self.url_b]
            # one after the other, each on ports picked just before it starts (start_router retries a port
            # that another process's outgoing connection took first)
            self.router, self.url = start_router("router", workers, "127.0.0.1", "round_robin", ROUTER_FLAGS, None,
                                                 deadline, 2)
            # A, and B's two data-parallel ranks
            self.router_dp, self.url_dp = start_router("dp-aware router", workers, "127.0.0.1", "cache_aware",
                                                       [*ROUTER_FLAGS, "--dp-aware"], None, deadline, 3)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for child in (self.router, self.router_dp, self.a, self.b):
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


def _info(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=30).json()


def test_dp_startup_log_and_server_info_name_each_rank(cluster):
    log = cluster.b.log()
    for rank in (0, 1):
        assert f"Data-parallel rank {rank}: pid" in log and f"Data-parallel rank {rank} ready" in log
        assert f"[DP{rank}] Model " in log  # each replica's own engine lines carry its rank
    assert "2 data-parallel replicas ready; dispatch: shortest_queue" in log
    info = _info(cluster.url_b)
    assert info["dp_size"] == 2 and [r["dp_rank"] for r in info["dp_ranks"]] == [0, 1]
    assert len({tuple(r["cores"]) for r in info["dp_ranks"]}) == min(2, len(os.sched_getaffinity(0)))
    for r in info["dp_ranks"]:  # started with its OpenMP team size (the spawned interpreter loads torch first)
        with open(f"/proc/{r['pid']}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert env.get(b"OMP_NUM_THREADS") == str(len(r["cores"])).encode(), r


def test_dp_front_relays_the_tokenizer_routes(cluster):
    """/tokenize, /detokenize (to one rank) and /tokenizer_info (the first live rank's) through the --dp-size front."""
    tok = httpx.post(cluster.url_b + "/tokenize", json={"prompt": "The sea"}, timeout=30).json()
    assert tok["count"] == len(tok["tokens"]) and tok["tokens"][0] == 2
    assert httpx.post(cluster.url_b + "/detokenize", json={"tokens": tok["tokens"][1:]}, timeout=30).json() == {
        "prompt": "The sea"}
    assert httpx.get(cluster.url_b + "/tokenizer_info", timeout=30).json()["bos_token"] == "<bos>"
    bad = httpx.post(cluster.url_b + "/detokenize", json={"tokens": "x"}, timeout=30)
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]


def test_dp_front_relays_responses_and_a_named_rank(cluster):
    """/v1/responses goes to one rank like the other generation routes; a body naming its data_parallel_rank
    (sglang-router --dp-aware) is served by that rank's replica, which accepts the field."""
    r = httpx.post(cluster.url_b + "/v1/responses", json={"input": "The sea", "max_output_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "response", r.text
    # each replica stores what it answered: a follow-up goes to the rank holding its previous response, and
    # GET / DELETE reach the holder, whichever rank the front would pick next (the idle front's pick is rank 0)
    for rank in (0, 1):
        r = httpx.post(cluster.url_b + "/v1/responses", json={"input": "The sea", "max_output_tokens": 2,
                                                              "data_parallel_rank": rank}, timeout=60)
        assert r.status_code == 200, r.text
    ids = [r.json()["id"]]
    for _ in range(3):
        f = httpx.post(cluster.url_b + "/v1/responses", json={"input": "and then", "max_output_tokens": 2,
                                                              "previous_response_id": ids[-1]}, timeout=60)
        assert f.status_code == 200 and f.json()["previous_response_id"] == ids[-1], f.text
        ids.append(f.json()["id"])
    for rid in ids:
        got = httpx.get(f"{cluster.url_b}/v1/responses/{rid}", timeout=30)
        assert got.status_code == 200 and got.json()["id"] == rid, got.text
    items = httpx.get(f"{cluster.url_b}/v1/responses/{ids[-1]}/input_items", timeout=30).json()
    assert [i["content"][0]["text"] for i in items["data"]] == ["and then"]
    assert httpx.delete(f"{cluster.url_b}/v1/responses/{ids[0]}", timeout=30).json()["deleted"] is True
    for gone in (httpx.get(f"{cluster.url_b}/v1/responses/{ids[0]}", timeout=30),
                 httpx.post(cluster.url_b + "/v1/responses", json={"input": "x", "previous_response_id": ids[0]},
                            timeout=30)):
        assert gone.status_code == 404 and ids[0] in gone.json()["error"]["message"], gone.text
    # a background response: GET (its status, then its events streamed from the holder) and cancel reach its rank
    bg = httpx.post(cluster.url_b + "/v1/responses", json={"input": "The sea", "max_output_tokens": 3,
                                                           "background": True, "data_parallel_rank": 1}, timeout=60)
    assert bg.status_code == 200 and bg.json()["status"] == "queued", bg.text
    rid = bg.json()["id"]
    for _ in range(600):
        done = httpx.get(f"{cluster.url_b}/v1/responses/{rid}", timeout=30).json()
        if done["status"] not in ("queued", "in_progress"):
            break
        time.sleep(0.05)
    assert done["status"] == "incomplete", done
    events = httpx.get(f"{cluster.url_b}/v1/responses/{rid}?stream=true", timeout=30)
    assert events.headers["content-type"].startswith("text/event-stream")
    assert events.text.count("data: ") > 3 and '"response.incomplete"' in events.text, events.text
    c = httpx.post(f"{cluster.url_b}/v1/responses/{rid}/cancel", timeout=30)
    assert c.status_code == 200 and c.json()["status"] == "incomplete", c.text
    for rank in (0, 1):
        g = httpx.post(cluster.url_b + "/generate", json={"text": "Hi", "data_parallel_rank": rank,
                                                         "sampling_params": {"max_new_tokens": 1}}, timeout=60)
        assert g.status_code == 200, g.text


def test_dp_front_pauses_updates_and_profiles_every_rank(cluster):
    tmp_path = f"/tmp/yoco-trace-{os.getpid()}-dp"  # inside the replicas' profiler folder (/tmp)
    shutil.rmtree(tmp_path, ignore_errors=True)
    p = httpx.post(cluster.url_b + "/pause_generation", json={"mode": "in_place"}, timeout=60)
    assert p.status_code == 200 and p.json()["kept"] == 0 and p.json()["mode"] == "in_place", p.text
    assert httpx.post(cluster.url_b + "/continue_generation", timeout=60).json()["status"] == "ok"
    served = httpx.get(cluster.url_b + "/get_model_info", timeout=30).json()["model_path"]
    u = httpx.post(cluster.url_b + "/update_weights_from_disk", json={"model_path": served, "weight_version": "w1"},
                   timeout=300)
    assert u.status_code == 200 and u.json()["success"] is True, u.text
    assert httpx.get(cluster.url_b + "/get_weight_version", timeout=30).json() == {"weight_version": "w1"}
    start = httpx.post(cluster.url_b + "/start_profile", json={"output_dir": str(tmp_path), "profile_id": "dp"},
                       timeout=60)
    assert start.status_code == 200 and start.text.count("Start profiling.") == 2, start.text
    stop = httpx.post(cluster.url_b + "/stop_profile", timeout=600)
    assert stop.status_code == 200, stop.text
    assert sorted(os.listdir(tmp_path)) == ["dp-TP-0-DP-0.trace.json.gz", "dp-TP-0-DP-1.trace.json.gz"]
    shutil.rmtree(tmp_path)


def test_dp_front_reads_bodies_within_the_limit(cluster):
    """The front holds a body only up to --max-request-body-bytes: 20 MB sent whole with 'Connection: close'
    gets the single server's 413 JSON (not a reset), and the front keeps serving."""
    huge = json.dumps({"text": "hi", "sampling_params": {"stop": ["x" * 2000] * 10_000}}).encode()
    r = httpx.post(cluster.url_b + "/generate", content=huge, timeout=60,
                   headers={"content-type": "application/json", "connection": "close"})
    assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"], r.text[:300]
    code, again = asyncio.run(_once(cluster.url_b))
    assert code == 200 and again["meta_info"]["completion_tokens"] == 2


def test_dp_aware_registration_and_chat_without_model(cluster):
    workers = httpx.get(cluster.url_dp + "/workers", timeout=10).json()["workers"]
    urls = sorted(w["url"] for w in workers)
    assert urls == sorted([f"{cluster.url_a}@0", f"{cluster.url_b}@0", f"{cluster.url_b}@1"]), urls
    before = [r["requests_served"] for r in httpx.get(cluster.url_b + "/get_server_info").json()["dp_ranks"]]
    for i in range(6):  # the router fills the missing model with "unknown"; greedy, no EOS (sampling could stop at 1)
        r = httpx.post(cluster.url_dp + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2, **LONG})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 2
    after = [r["requests_served"] for r in httpx.get(cluster.url_b + "/get_server_info").json()["dp_ranks"]]
    assert sum(after) >= sum(before), (before, after)


async def _run_all(url: str, bodies: list[dict[str, Any]], during=None) -> list[int | str]:
    """POST every body to /generate at once; ``during(tasks)`` runs once they are all sent. Status per request."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0)) as client:

        async def one(body: dict[str, Any]) -> int | str:
            try:
                r = await client.post(url + "/generate", json=body)
                return r.status_code if r.status_code != 200 else len(r.json()["output_ids"])
            except httpx.HTTPError as e:
                return type(e).__name__

        tasks = [asyncio.create_task(one(b)) for b in bodies]
        if during is not None:
            await during(tasks)
        return list(await asyncio.gather(*tasks))


def _load(url: str) -> list[dict[str, int]]:
    return httpx.get(url + "/get_load", timeout=10).json()


def test_get_load_follows_load(cluster):
    idle = _load(cluster.url_b)
    assert [e["dp_rank"] for e in idle] == [0, 1] and all(e["num_reqs"] == e["num_waiting_reqs"] == 0 for e in idle)
    seen: dict[str, Any] = {}

    async def watch(_tasks) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen.get("busy"):
            loads = _load(cluster.url_a) + _load(cluster.url_b)
            router = httpx.get(cluster.url + "/get_loads", timeout=10).json()["workers"]
            if any(e["num_reqs"] > 0 and e["num_tokens"] > 0 for e in loads) and \
                    any(w["load"] > 0 for w in router):
                seen.update(busy=loads, router=router)
            await asyncio.sleep(0.05)

    bodies = [{"input_ids": prompt_ids(40 + i, 24), "sampling_params": {**LONG, "max_new_tokens": 48}} for i in range(6)]
    got = asyncio.run(_run_all(cluster.url, bodies, watch))
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


async def _post(client: httpx.AsyncClient, url: str, body: dict, stream: bool = False):
    if not stream:
        r = await client.post(url + "/generate", json=body)
        return r.status_code, r.json()
    async with client.stream("POST", url + "/generate", json={**body, "stream": True}) as r:
        return r.status_code, [line async for line in r.aiter_lines() if line.startswith("data: ")]


def test_shortest_queue_sends_work_to_the_idle_rank(cluster):
    url = cluster.url_b
    before = [r["requests_served"] for r in _info(url)["dp_ranks"]]

    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            long = asyncio.create_task(_post(c, url, {"input_ids": prompt_ids(1, 8),
                                                      "sampling_params": {**LONG, "max_new_tokens": 400}}))
            while sum(r["in_flight"] for r in _info(url)["dp_ranks"]) == 0:
                await asyncio.sleep(0.02)
            busy_rank = next(r["dp_rank"] for r in _info(url)["dp_ranks"] if r["in_flight"])
            for i in range(3):
                code, _ = await _post(c, url, {"input_ids": prompt_ids(2 + i, 4),
                                               "sampling_params": {**LONG, "max_new_tokens": 2}})
                assert code == 200
            assert (await long)[0] == 200
            return busy_rank

    busy = asyncio.run(run())
    after = [r["requests_served"] for r in _info(url)["dp_ranks"]]
    assert after[busy] - before[busy] == 1 and after[1 - busy] - before[1 - busy] == 3, (before, after)


def test_sigkill_of_a_worker_loses_only_its_in_flight_requests(cluster):
    bodies = [{"input_ids": prompt_ids(60 + i, 16), "sampling_params": {**LONG, "max_new_tokens": 64}}
              for i in range(8)]
    in_flight_on_a: list[int] = []

    async def kill_a(_tasks) -> None:
        busy = lambda: sum(e["num_reqs"] for e in _load(cluster.url_a))  # noqa: E731
        assert await asyncio.to_thread(_wait_until, lambda: busy() > 0), "worker A never got a request"
        in_flight_on_a.append(busy())
        os.kill(cluster.a.proc.pid, signal.SIGKILL)

    got = asyncio.run(_run_all(cluster.url, bodies, kill_a))
    lost = [g for g in got if g != 64]
    assert len(lost) <= in_flight_on_a[0], f"{len(lost)} requests lost, {in_flight_on_a[0]} were on worker A: {got}"
    assert _wait_until(lambda: not _healthy(cluster.url, cluster.url_a), 60), "the router never marked A unhealthy"
    after = asyncio.run(_run_all(cluster.url, [{"input_ids": prompt_ids(80 + i, 8),
                                                "sampling_params": {**LONG, "max_new_tokens": 4}} for i in range(4)]))
    assert after == [4] * 4, after  # B alone serves what comes next
    # A comes back on its port; the router's health check takes it in again
    cluster.a = spawn("worker A", worker_argv(ARGV_OFF, cluster.port_a), None)
    assert cluster.a.wait_ready(time.monotonic() + START_TIMEOUT_S) == cluster.url_a
    assert _wait_until(lambda: _healthy(cluster.url, cluster.url_a), 60), "the router never took A back"


def test_a_dead_replica_fails_its_requests_cleanly_and_health_says_so(cluster):
    url = cluster.url_b
    pid1 = _info(url)["dp_ranks"][1]["pid"]
    body = {"sampling_params": {**LONG, "max_new_tokens": 480}}  # long enough to be in flight at the kill

    async def stream(c: httpx.AsyncClient, i: int, started: asyncio.Event):
        async with c.stream("POST", url + "/generate", json={**body, "input_ids": prompt_ids(10 + i, 8),
                                                            "stream": True}) as r:
            lines = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    started.set()
            return r.status_code, lines

    async def run():
        async with httpx.AsyncClient(timeout=60) as c:
            # The two plain requests go first; once both streams have their first chunk, all four are running
            # (480 tokens cannot finish in one prefill's time). Polling /get_load for four in flight raced the
            # requests on an idle machine: its answers wait behind the replicas' decode loops.
            tasks = [asyncio.create_task(_post(c, url, {**body, "input_ids": prompt_ids(10 + i, 8)})) for i in range(2)]
            await asyncio.sleep(0.05)
            started = [asyncio.Event(), asyncio.Event()]
            tasks += [asyncio.create_task(stream(c, i, started[i - 2])) for i in (2, 3)]
            deadline = time.monotonic() + 30
            while not all(e.is_set() for e in started):
                assert time.monotonic() < deadline and not any(t.done() for t in tasks), \
                    f"the four requests were never in flight together: {[str(t.result())[:200] for t in tasks if t.done()]}"
                await asyncio.sleep(0.01)
            os.kill(pid1, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    out = asyncio.run(run())  # the client's timeout (60 s) guards against a hang
    plain_ok = [o for o in out[:2] if o[0] == 200 and o[1]["meta_info"]["completion_tokens"] == 480]
    plain_lost = [o[1]["error"]["message"] for o in out[:2] if o[0] == 503]
    stream_ok = [o for o in out[2:] if o[0] == 200 and o[1][-1] == "data: [DONE]" and '"error"' not in o[1][-2]]
    stream_lost = [o[1][-2] for o in out[2:] if o[0] == 200 and o[1][-1] == "data: [DONE]" and '"error"' in o[1][-2]]
    # shortest_queue put two of the four on rank 1: exactly those are lost, each with an error naming the rank
    assert len(plain_ok) + len(stream_ok) == 2 and len(plain_lost) + len(stream_lost) == 2, out
    assert all("data-parallel rank 1" in m and "exited" in m for m in plain_lost + stream_lost), out
    h = httpx.get(url + "/health")
    assert h.status_code == 503 and "data-parallel rank 1" in h.json()["error"]["message"]
    code, again = asyncio.run(_once(url))
    assert code == 200 and again["meta_info"]["completion_tokens"] == 2  # rank 0 keeps serving
    assert [e["dp_rank"] for e in _load(url)] == [0]
    assert _wait_until(lambda: not _healthy(cluster.url, cluster.url_b), 60), "the router never marked B unhealthy"


async def _once(url: str):
    async with httpx.AsyncClient(timeout=60) as c:
        return await _post(c, url, {"input_ids": prompt_ids(30, 4), "sampling_params": {**LONG, "max_new_tokens": 2}})


def test_sigterm_of_a_worker_loses_nothing(cluster):
    # (12 tokens: on a loaded 2-core CI machine, 4 x 24 steps of A once outlasted the 5 s grace: [24, 23, 23, 24])
    bodies = [{"input_ids": prompt_ids(90 + i, 12), "sampling_params": {**LONG, "max_new_tokens": 12}}
              for i in range(4)]

    async def term_a(tasks) -> None:
        # Every request reached A: finished, or in flight there. Finished ones are counted first, so one that
        # ends between the two reads is undercounted (we wait longer), never counted twice. Requiring all four
        # in flight at once raced short requests against a slow /get_load poll on an idle machine.
        def all_reached_a() -> bool:
            done = sum(t.done() for t in tasks)
            return done + sum(e["num_reqs"] for e in _load(cluster.url_a)) >= len(bodies)

        assert await asyncio.to_thread(_wait_until, all_reached_a), "the requests never reached A"
        cluster.a.proc.send_signal(signal.SIGTERM)

    got = asyncio.run(_run_all(cluster.url, bodies, term_a))  # B is marked down: all go to A
    assert got == [12] * len(bodies), got
    assert cluster.a.proc.wait(30) == 0


def test_sigterm_stops_the_dp_front_and_its_replicas(cluster):
    pids = [r["pid"] for r in _info(cluster.url_b)["dp_ranks"]]
    assert cluster.b.stop() == 0
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
