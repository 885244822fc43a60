"""SGLang's /update_weights_from_disk on a server of its own: another checkpoint's weights served from the next
request on (and the first ones back again), the refusals leaving the served weights as they were."""

from __future__ import annotations

import json
import os
import shutil
import threading

import httpx
import pytest
from safetensors.torch import load_file, save_file

from contracts.http_support import ARGV_OFF, TIMEOUT, post

BODY = {"input_ids": [2, 40, 41, 42, 43], "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                               "ignore_eos": True}}


@pytest.fixture(scope="module")
def server():
    from contracts.adapters.impl_http import start

    s = start(ARGV_OFF)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def checkpoints(server, tmp_path_factory):
    """(the served checkpoint, a copy whose linear weights are scaled: the same architecture, other tokens)."""
    served = httpx.get(server.url + "/get_model_info", timeout=TIMEOUT).json()["model_path"]
    other = str(tmp_path_factory.mktemp("weights") / "scaled")
    shutil.copytree(served, other)
    path = os.path.join(other, "model.safetensors")
    tensors = load_file(path)
    save_file({k: v * 1.5 if k.endswith("proj.weight") else v for k, v in tensors.items()}, path,
              metadata={"format": "pt"})
    return served, other


def _ids(url):
    r = post(url, "/generate", BODY)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def _update(url, **body):
    return httpx.post(url + "/update_weights_from_disk", json=body, timeout=TIMEOUT)


def test_other_weights_are_served_then_the_first_again(server, checkpoints):
    served, other = checkpoints
    url = server.url
    first = _ids(url)
    r = _update(url, model_path=other, weight_version="v2")
    assert r.status_code == 200 and r.json()["success"] is True and "Succeeded" in r.json()["message"], r.text
    assert httpx.get(url + "/get_weight_version", timeout=TIMEOUT).json() == {"weight_version": "v2"}
    info = httpx.get(url + "/get_server_info", timeout=TIMEOUT).json()
    assert info["weights_path"] == other and info["weight_version"] == "v2"
    scaled = _ids(url)
    assert scaled != first  # the radix cache was flushed: the prompt ran through the new weights
    assert _update(url, model_path=served).json()["success"] is True
    assert _ids(url) == first
    v = httpx.post(url + "/update_weight_version", json={"new_version": "v3"}, timeout=TIMEOUT)
    assert v.json() == {"success": True, "message": "Weight version updated to v3", "new_version": "v3"}
    assert httpx.get(url + "/get_weight_version", timeout=TIMEOUT).json() == {"weight_version": "v3"}
    assert httpx.post(url + "/update_weight_version", json={}, timeout=TIMEOUT).status_code == 400


def test_refusals_leave_the_served_weights(server, checkpoints, tmp_path):
    url = server.url
    before = _ids(url)
    bad_arch = tmp_path / "narrow"
    shutil.copytree(checkpoints[0], bad_arch)
    cfg = json.loads((bad_arch / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text["rms_norm_eps"] = 0.5
    (bad_arch / "config.json").write_text(json.dumps(cfg))
    for body, words in (({"model_path": str(tmp_path / "missing")}, "no config.json"),
                        ({"model_path": str(bad_arch)}, "rms_norm_eps differ")):
        r = _update(url, **body)
        assert r.status_code == 400 and r.json()["success"] is False and words in r.json()["message"], r.text
    for body, field in (({}, "model_path"), ({"model_path": "x", "load_format": "gguf"}, "load_format")):
        r = _update(url, **body)
        assert r.status_code == 400 and field in r.text, r.text
    assert _ids(url) == before
    # requests in flight: refused unless paused (they go on with their KV) or aborted
    long = {**BODY, "sampling_params": {**BODY["sampling_params"], "max_new_tokens": 400}}
    first_chunk = threading.Event()

    def stream():
        with httpx.stream("POST", url + "/generate", json={**long, "stream": True}, timeout=TIMEOUT) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    first_chunk.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    assert first_chunk.wait(60)
    r = _update(url, model_path=checkpoints[0])
    assert r.status_code == 400 and "in flight" in r.json()["message"] and "pause_generation" in r.json()["message"]
    assert httpx.post(url + "/pause_generation", json={"mode": "in_place"}, timeout=TIMEOUT).status_code == 200
    r = _update(url, model_path=checkpoints[0])
    assert r.status_code == 200 and r.json()["num_paused_requests"] == 1, r.text
    assert "not flushed" in r.json()["message"]  # the paused request holds its KV
    assert httpx.post(url + "/continue_generation", timeout=TIMEOUT).status_code == 200
    t.join(60)
    assert not t.is_alive()
