"""SGLang's /pause_generation and /continue_generation on a running server: requests wait while paused, and a
request paused in place or retracted mid-generation ends with the tokens it would have had unpaused."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from contracts.http_support import TIMEOUT, post

N = 48


def _body(seed: int) -> dict:
    return {"input_ids": [2, 10 + seed, 20 + seed, 30], "sampling_params": {"max_new_tokens": N, "temperature": 0,
                                                                             "ignore_eos": True}}


def _control(url, path, body=None):
    r = httpx.post(url + path, json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def _info(url):
    return httpx.get(url + "/get_server_info", timeout=TIMEOUT).json()


class Streamed(threading.Thread):
    """A streamed /generate on its own thread: its chunks' token counts as they come, its last chunk."""

    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)
        self.url, self.body, self.counts, self.last, self.first = url, body, [], None, threading.Event()
        self.start()

    def run(self):
        with httpx.stream("POST", self.url + "/generate", json={**self.body, "stream": True}, timeout=TIMEOUT) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.last = json.loads(line[6:])
                    self.counts.append(len(self.last["output_ids"]))
                    self.first.set()


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_paused_generation_resumes_with_the_same_tokens(url, mode):
    want = post(url, "/generate", _body(1)).json()["output_ids"]
    s = Streamed(url, _body(1))
    assert s.first.wait(60)
    got = _control(url, "/pause_generation", {"mode": mode})
    assert got["status"] == "ok" and got["mode"] == mode and got["kept" if mode == "in_place" else "retracted"] == 1
    assert _info(url)["paused"] == mode
    held = len(s.counts)
    time.sleep(0.5)
    assert len(s.counts) <= held + 1 and s.is_alive()  # (a chunk on its way when the pause came)
    assert _control(url, "/continue_generation", {})["status"] == "ok" and _info(url)["paused"] is None
    s.join(60)
    assert s.last["output_ids"] == want and s.last["meta_info"]["finish_reason"]["type"] == "length"


def test_requests_wait_while_paused_and_abort_mode_ends_them(url):
    assert _control(url, "/pause_generation", {"mode": "in_place"})["kept"] == 0
    s = Streamed(url, _body(2))
    deadline = time.time() + 30
    while _info(url)["num_waiting_reqs"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert not s.counts  # it waits: no forward runs while paused
    probe = httpx.get(url + "/health_generate", timeout=TIMEOUT)
    assert probe.status_code == 503 and "paused (in_place)" in probe.text and "continue_generation" in probe.text
    assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200  # alive, only paused
    ready = httpx.get(url + "/ready", timeout=TIMEOUT)  # SGLang's readiness: not while paused
    assert ready.status_code == 503 and "paused (in_place)" in ready.json()["error"]["message"]
    assert _control(url, "/pause_generation", {"mode": "abort"})["aborted"] == 1
    s.join(30)
    assert s.last["meta_info"]["finish_reason"]["type"] == "abort"
    _control(url, "/continue_generation")
    assert httpx.get(url + "/ready", timeout=TIMEOUT).json() == {"status": "ready"}
    assert post(url, "/generate", _body(2)).json()["meta_info"]["completion_tokens"] == N


def test_pause_refusals(url):
    r = httpx.post(url + "/pause_generation", json={"mode": "sleep"}, timeout=TIMEOUT)
    assert r.status_code == 400 and "mode" in r.text and _info(url)["paused"] is None
    r = httpx.post(url + "/continue_generation", json={"torch_empty_cache": "yes"}, timeout=TIMEOUT)
    assert r.status_code == 400 and "torch_empty_cache" in r.text
