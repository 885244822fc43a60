"""--api-key on every route but /health, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from contracts.http_support import ARGV_OFF, openai_client, prompt_ids


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/get_server_info"),
                                         ("POST", "/generate"), ("POST", "/v1/chat/completions")])
def test_api_key_required(key_url, api_key, method, path):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}} if path == "/generate" else None
    if path == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.request(method, key_url + path, json=body).status_code == 401
    r = httpx.request(method, key_url + path, json=body, headers=_auth("wrong"))
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    assert httpx.request(method, key_url + path, json=body, headers=_auth(api_key), timeout=60).status_code == 200


def test_health_is_open_and_openai_client_sends_the_key(key_url, api_key):
    assert httpx.get(key_url + "/health").status_code == 200
    from openai import OpenAI

    client = OpenAI(base_url=key_url + "/v1", api_key=api_key, max_retries=0)
    assert client.completions.create(model=client.models.list().data[0].id, prompt="x", max_tokens=1).usage
    assert openai_client(key_url).api_key == "unused"  # the contracts' client has no key: it would get 401


@pytest.mark.slow  # starts its own server process
def test_sigterm_finishes_cleanly():
    """SIGTERM with a stream in flight: the stream ends with a final event and [DONE]; the process exits 0."""
    from contracts.adapters.impl_http import start
    from impl.server.runtime import SHUTDOWN_GRACE_S

    server = start(ARGV_OFF)
    try:
        events: list[str] = []
        body = {"input_ids": prompt_ids(3, 5), "stream": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 400, "ignore_eos": True}}

        def client() -> None:
            with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
                events.extend(line for line in r.iter_lines() if line)

        t = threading.Thread(target=client)
        t.start()
        while len(events) < 2 and t.is_alive():
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        t.join(SHUTDOWN_GRACE_S + 20)
        assert not t.is_alive()
        assert server.proc.wait(SHUTDOWN_GRACE_S + 20) == 0
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][6:])
        assert last["meta_info"]["finish_reason"]["type"] in ("abort", "length")
        assert "Shutting down: 1 request(s) in flight" in server.log()
    finally:
        server.stop()
