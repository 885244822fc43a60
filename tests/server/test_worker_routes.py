"""What SGLang's clients and sglang-router read from a worker (issue 17): the served name defaults to the model
path, 'unknown' means no model, /get_load in SGLang's shape behind --api-key, dp_size and the keep-alive in
/get_server_info, and /flush_cache?timeout= waiting for idle."""

from __future__ import annotations

import os

import httpx

from contracts.http_support import post, prompt_ids
from tests.helpers.busy_server import while_generating

GREEDY = {"temperature": 0.0, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_served_model_name_and_tokenizer_path_default_to_the_model_path(url):
    info = httpx.get(url + "/get_model_info").json()
    path = info["model_path"]
    assert info["served_model_name"] == path and info["tokenizer_path"] == path
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == path
    server = httpx.get(url + "/server_info").json()
    assert server["served_model_name"] == path and server["tokenizer_path"] == path
    for model in (path, os.path.basename(path), "default", "unknown", None):  # what clients and routers send
        body = CHAT if model is None else {**CHAT, "model": model}
        r = post(url, "/v1/chat/completions", body)
        assert r.status_code == 200, (model, r.text)
        if model is not None:
            assert r.json()["model"] == path
    r = post(url, "/v1/completions", {"model": "unknownx", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 400 and path in r.json()["error"]["message"]


def test_get_load_shape_and_dp_size(url):
    load = httpx.get(url + "/get_load").json()
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    info = httpx.get(url + "/get_server_info").json()
    assert info["dp_size"] == 1 and info["timeout_keep_alive"] == 120


def test_get_load_needs_the_api_key(key_url, api_key):
    assert httpx.get(key_url + "/get_load").status_code == 401
    r = httpx.get(key_url + "/get_load", headers={"Authorization": f"Bearer {api_key}"})
    assert r.status_code == 200 and r.json()[0]["dp_rank"] == 0


def test_get_load_counts_a_running_request(url):
    body = {"input_ids": prompt_ids(70, 20), "sampling_params": {**GREEDY, "max_new_tokens": 480}}
    load, r = while_generating(url, body, lambda: httpx.get(url + "/get_load").json()[0])
    assert r.status_code == 200
    assert load["num_reqs"] == 1 and load["num_waiting_reqs"] == 0 and 20 <= load["num_tokens"] <= 500, load


def test_flush_cache_timeout_waits_for_idle(url):
    body = {"input_ids": prompt_ids(71, 6), "sampling_params": {**GREEDY, "max_new_tokens": 480}}

    def flush_twice():
        busy = httpx.post(url + "/flush_cache")  # no timeout: refused at once while the request runs
        waited = httpx.post(url + "/flush_cache?timeout=60", timeout=90)
        return busy, waited

    (busy, waited), r = while_generating(url, body, flush_twice)
    assert busy.status_code == 400 and "timeout" in busy.json()["error"]["message"]
    assert waited.status_code == 200 and waited.text == "Cache flushed.\n"
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 480  # it waited, not aborted
    for bad in ("-1", "nan", "inf", "soon"):
        r = httpx.post(url + f"/flush_cache?timeout={bad}")
        assert r.status_code == 400 and "timeout" in r.json()["error"]["message"], (bad, r.text)
