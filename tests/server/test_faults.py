"""The fault suite (issue 14, item 5b): a server whose requests fail on purpose where their rid says.

The server runs ``contracts.fault_injection`` (a request whose rid contains ``fault-<stage>`` raises at that
stage). For every fault class, several cases (routes, streaming or not, n > 1): the offending request gets its
own error (a 500 JSON body, or an error event then ``[DONE]``), a request running concurrently completes with
exactly the text of a fault-free run, KV is fully free afterwards and /health stays 200. A server that speculates
(FROZEN_KV_MTP) fails the requests of a round whose verify forward or draft fails, and only those. The integrity
fault runs last: it must turn the server unhealthy (/health 503 with the reason) instead of looping.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from contracts.http_support import ARGV_OFF, TIMEOUT, post, read_sse

GREEDY = {"temperature": 0.0, "ignore_eos": True}
PER_REQUEST = ("logprobs", "sampler", "stop", "detok")


@pytest.fixture(scope="module")
def fault_url(hardened_url) -> str:
    return hardened_url


def _ids(seed: int, n: int = 6) -> list[int]:
    return [20 + (seed * 31 + i * 17) % 200 for i in range(n)]


def _body(route: str, seed: int, rid: str, n: int = 1, tokens: int = 6) -> dict:
    if route == "/generate":
        return {"input_ids": _ids(seed), "rid": rid, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {**GREEDY, "max_new_tokens": tokens, "n": n, "stop": ["never-seen-stop"]}}
    common = {"rid": rid, "n": n, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
              "stop": ["never-seen-stop"]}
    if route == "/v1/completions":
        return {**common, "prompt": _ids(seed), "logprobs": 1}
    return {**common, "messages": [{"role": "user", "content": f"tell me {seed}"}], "logprobs": True}


def _call(url: str, route: str, body: dict, stream: bool) -> tuple[int, object]:
    """(status, parsed JSON body | SSE)."""
    if not stream:
        r = post(url, route, body)
        return r.status_code, r.json()
    with httpx.stream("POST", url + route, json={**body, "stream": True}, timeout=TIMEOUT) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json()
        return 200, read_sse(r.iter_lines())


def _texts(route: str, status: int, out) -> list[str]:
    assert status == 200, out
    if isinstance(out, dict):
        if route == "/generate":
            return [out["text"]]
        return [c.get("text", (c.get("message") or {}).get("content")) for c in out["choices"]]
    ev = out.events
    assert out.done and out.after_done == 0 and not any("error" in e for e in ev)
    if route == "/generate":
        return [ev[-1]["text"]]
    acc: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for e in ev:
        for c in e.get("choices", []):
            acc[c["index"]] = acc.get(c["index"], "") + (c.get("text") or (c.get("delta") or {}).get("content") or "")
            finishes[c["index"]] = finishes.get(c["index"], 0) + (c["finish_reason"] is not None)
    assert set(finishes.values()) == {1}, finishes
    return [acc[k] for k in sorted(acc)]


def _assert_failed(status: int, out, stream: bool, says: str = "internal error") -> None:
    if not stream:
        assert status == 500, out
        assert says in out["error"]["message"] and out["error"]["code"] == 500, out
        return
    assert status == 200 and out.done and out.after_done == 0, out
    errors = [e for e in out.events if "error" in e]
    assert errors and errors[-1]["error"]["code"] == 500 and says in errors[-1]["error"]["message"], errors


def _idle_and_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        info = httpx.get(url + "/get_server_info", timeout=TIMEOUT).json()
        if info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    assert info["token_usage"] == 0.0, f"KV not free after the faults: token_usage {info['token_usage']}"
    r = httpx.get(url + "/health", timeout=TIMEOUT)
    assert r.status_code == 200, r.text


CASES = [(stage, route, stream, n) for stage in PER_REQUEST for route, stream, n in (
    ("/generate", False, 1), ("/generate", True, 2), ("/v1/completions", True, 1), ("/v1/chat/completions", False, 2))]


@pytest.mark.parametrize("stage,route,stream,n", CASES, ids=[f"{s}-{r.strip('/').replace('/', '_')}-"
                                                              f"{'stream' if st else 'plain'}-n{n}" for s, r, st, n in CASES])
def test_per_request_fault_is_isolated(fault_url, stage, route, stream, n):
    seed = PER_REQUEST.index(stage) * 10 + n
    ref = _texts(route, *_call(fault_url, route, _body(route, seed, f"ref-{stage}-{route}-{stream}"), stream))
    results: dict[str, tuple[int, object]] = {}

    def run(name: str, body: dict) -> None:
        results[name] = _call(fault_url, route, body, stream)

    threads = [threading.Thread(target=run, args=("bad", _body(route, seed + 1, f"x-fault-{stage}-{route}", n))),
               threading.Thread(target=run, args=("good", _body(route, seed, f"good-{stage}-{route}-{stream}")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_failed(*results["bad"], stream)
    assert _texts(route, *results["good"]) == ref
    _idle_and_healthy(fault_url)


@pytest.mark.parametrize("route,stream", [("/generate", False), ("/generate", True), ("/v1/chat/completions", True)])
def test_failed_batch_fails_only_that_batch(fault_url, route, stream):
    status, out = _call(fault_url, route, _body(route, 77, f"fault-forward-{route}-{stream}"), stream)
    _assert_failed(status, out, stream)
    _idle_and_healthy(fault_url)
    ref = _texts(route, *_call(fault_url, route, _body(route, 78, f"after-forward-{route}-{stream}"), False))
    assert ref and all(ref)
    assert httpx.get(fault_url + "/health_generate", timeout=60).status_code == 200


@pytest.fixture(scope="module")
def mtp_fault_url():
    """A speculating fault-suite server running one request at a time, so a round holds only that request."""
    from contracts.adapters.impl_http import start
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    mtp = ["--prefill-attention-backend", "torch_native", "--speculative-algorithm", "NEXTN",
           "--speculative-draft-model-path", tiny_checkpoint("assistant"), "--max-running-requests", "1"]
    server = start([*ARGV_OFF, *mtp], mutant="InjectedFaults")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.parametrize("stage,route,stream", [("verify", "/generate", False), ("verify", "/v1/chat/completions", True),
                                                ("draft", "/v1/completions", True)])
def test_failed_speculative_round_fails_only_its_requests(mtp_fault_url, stage, route, stream):
    url = mtp_fault_url
    ref = _texts(route, *_call(url, route, _body(route, 40, f"ref-{stage}-{route}-{stream}"), stream))
    results: dict[str, tuple[int, object]] = {}

    def run(name: str, body: dict) -> None:
        results[name] = _call(url, route, body, stream)

    threads = [threading.Thread(target=run, args=("bad", _body(route, 41, f"x-fault-{stage}-{route}-{stream}"))),
               threading.Thread(target=run, args=("good", _body(route, 40, f"good-{stage}-{route}-{stream}")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_failed(*results["bad"], stream, says="the forward pass of this request's batch failed")
    assert _texts(route, *results["good"]) == ref
    _idle_and_healthy(url)


@pytest.mark.soak
def test_integrity_failure_makes_the_server_unhealthy():
    """A server of its own (it ends unhealthy); in ``make soak`` (CI covers the engine side: ENGINE-FAULT-ONE-FINAL)."""
    from contracts.adapters.impl_http import start

    server = start(ARGV_OFF, mutant="InjectedFaults")
    try:
        url = server.url
        status, out = _call(url, "/generate", _body("/generate", 90, "fault-integrity-1"), False)
        assert status == 200  # the request itself finished; the integrity check after it fails
        deadline = time.monotonic() + 30
        while (h := httpx.get(url + "/health", timeout=TIMEOUT)).status_code == 200:
            assert time.monotonic() < deadline, "the failed integrity check never made /health unhealthy"
            time.sleep(0.05)
        assert h.status_code == 503 and "integrity" in h.json()["error"]["message"]
        assert httpx.get(url + "/health_generate", timeout=60).status_code == 503
        r = post(url, "/generate", _body("/generate", 91, "late-1"))
        assert r.status_code == 503 and "unhealthy" in r.json()["error"]["message"]
    finally:
        server.stop()
