"""SGLang's /start_profile and /stop_profile on a running server: the trace file bench_serving --profile asks for,
its own stop after num_steps forwards, and the refusals."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import time
import uuid

import httpx
import pytest

from contracts.http_support import post


@pytest.fixture
def tmp_path():
    """A folder inside the test server's profiler folder (SGLANG_TORCH_PROFILER_DIR unset: /tmp), whatever
    pytest's own temporary root is."""
    path = pathlib.Path("/tmp") / f"yoco-trace-{uuid.uuid4().hex}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(url, body=None):
    return httpx.post(url + "/start_profile", json=body, timeout=60)


def _stop(url):
    return httpx.post(url + "/stop_profile", timeout=600)


def _generate(url, n=3):
    r = post(url, "/generate", {"text": "The sea is", "sampling_params": {"max_new_tokens": n, "temperature": 0}})
    assert r.status_code == 200, r.text


def _events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_a_trace_of_the_steps_between_start_and_stop(url, tmp_path):
    """bench_serving's body (its defaults: activities CPU and GPU, num_steps absent) -> a gzip'd Chrome trace
    named as SGLang names it, holding the forward's ops; a second start while one runs and a second stop are 400s."""
    out = tmp_path / "run"
    r = _start(url, {"activities": ["CPU", "GPU"], "num_steps": None, "profile_by_stage": False,
                     "profile_stages": None, "output_dir": str(out), "profile_prefix": None, "profile_id": "t1"})
    assert r.status_code == 200 and r.text.startswith("Start profiling.\n"), r.text
    assert "GPU activities: none on this CPU server" in r.text
    again = _start(url, {"output_dir": str(out)})
    assert again.status_code == 400 and "already in progress" in again.json()["error"]["message"]
    _generate(url)
    stop = _stop(url)
    path = str(out / "t1-TP-0.trace.json.gz")
    assert stop.status_code == 200 and path in stop.text, stop.text
    names = {e.get("name", "") for e in _events(path)}
    assert any(n.startswith("aten::") for n in names), sorted(names)[:20]
    late = _stop(url)
    assert late.status_code == 400 and "not in progress" in late.text and path in late.text


def test_num_steps_ends_the_trace_by_itself(url, tmp_path):
    """num_steps / start_step as bench_serving sends them (strings of digits), a relative output_dir under the
    server's folder (SGLANG_TORCH_PROFILER_DIR, /tmp here), GET as SGLang allows."""
    rel = os.path.relpath(tmp_path / "auto", "/tmp")
    r = _start(url, {"num_steps": "2", "output_dir": rel, "profile_id": "t2", "profile_prefix": "pre",
                     "activities": ["CPU", "MEM"], "with_stack": False, "record_shapes": False})
    assert r.status_code == 200, r.text
    path = tmp_path / "auto" / "pre-t2-TP-0.trace.json.gz"
    _generate(url, 4)
    deadline = time.time() + 60
    while not path.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert path.exists() and _events(path)
    assert _stop(url).status_code == 400  # it ended by itself
    # stopped before its start_step: no trace, said so
    assert httpx.get(url + "/start_profile", timeout=60).status_code == 200  # (GET: no body, the defaults)
    stop = _stop(url)
    assert stop.status_code == 200, stop.text
    os.remove(stop.text.rsplit("saved to ", 1)[1].strip())  # /tmp/<time>-TP-0.trace.json.gz
    assert _start(url, {"start_step": 10**9, "output_dir": str(tmp_path), "profile_id": "t3"}).status_code == 200
    never = _stop(url)
    assert never.status_code == 400 and "before start_step 1000000000" in never.text and "no trace" in never.text


def test_profile_refusals(url):
    for body, field in (({"output_dir": "/etc/traces"}, "output_dir"), ({"output_dir": "../etc"}, "output_dir"),
                        ({"activities": ["RPD"]}, "activities"), ({"activities": ["TPU"]}, "activities"),
                        ({"profile_by_stage": True}, "profile_by_stage"), ({"num_steps": "two"}, "num_steps"),
                        ({"num_steps": 0}, "num_steps"), ({"num_steps": 10_001}, "num_steps"),
                        ({"profile_id": "../x"}, "profile_id"),
                        ({"profile_stages": ["prefill"]}, "profile_stages")):
        r = _start(url, body)
        assert r.status_code == 400 and field in r.text, (body, r.text)
    bad = httpx.post(url + "/start_profile", content=b"[1]", headers={"content-type": "application/json"}, timeout=30)
    assert bad.status_code == 400
    assert _stop(url).status_code == 400  # nothing was started
