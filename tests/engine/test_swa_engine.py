"""The hybrid sliding-window pool in the engine: what /get_server_info and the load view report, and the
startup refusals of budgets it cannot serve (behaviour under pressure: contracts KV-SWA-*)."""

from __future__ import annotations

import pytest

from impl import Engine
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.engines import engine, prompts

GREEDY = {"max_new_tokens": 20, "temperature": 0.0, "ignore_eos": True}


def test_server_info_and_load_report_both_pools():
    eng = engine("e2b", max_total_tokens=400, swa_full_tokens_ratio=0.25)
    pools = eng.get_server_info()["kv_pools"]
    assert pools["kind"] == "hybrid sliding-window" and pools["swa_full_tokens_ratio"] == 0.25
    full, swa = pools["full"], pools["swa"]
    assert (full["layers"], swa["layers"], swa["sliding_window"]) == (3, 12, 16)
    assert (full["tokens"], swa["tokens"]) == (400, 100)  # --max-total-tokens names the full budget, as in SGLang
    assert eng.get_server_info()["max_total_num_tokens"] == full["tokens"]
    eng.generate(input_ids=prompts(), sampling_params=GREEDY)
    load = eng.load()
    assert (load.kv_tokens_total, load.swa_tokens_total) == (full["tokens"], swa["tokens"])
    assert (load.kv_tokens_available, load.swa_tokens_available) == (full["tokens"], swa["tokens"])  # all freed
    one = engine("e2b", max_total_tokens=400, disable_hybrid_swa_memory=True).get_server_info()["kv_pools"]
    assert one == {"kind": "one pool", "full": {"layers": 15, "bytes_per_token": 2304, "tokens": 400}}


def test_budgets_the_sliding_pool_cannot_serve_are_refused_or_bounded():
    path = tiny_checkpoint("e2b")
    with pytest.raises(ValueError, match="cannot hold one request's window and its next token"):
        Engine(path, max_total_tokens=40, swa_full_tokens_ratio=0.05)
    # without chunked prefill a prompt takes its sliding-window slots at once: the context is bounded by them
    eng = engine("e2b", max_total_tokens=200, swa_full_tokens_ratio=0.25, chunked_prefill_size=-1)
    assert eng.scheduler_config.max_req_len == eng.scheduler.kv.allocator.swa_capacity - 1 < eng.runner.max_total_num_tokens


def test_server_info_and_log_say_which_rule_sized_the_sliding_window_pool():
    eng = engine("e2b", max_total_tokens=2000, max_running_requests=3, disable_radix_cache=True, chunked_prefill_size=16)
    pools = eng.get_server_info()["kv_pools"]
    sizing = pools["sizing"]
    assert sizing["mode"] == "request_cap" and "--max-running-requests 3" in sizing["reason"]
    cap = sizing["request_cap"]
    assert (cap["per_request"], cap["tokens"]) == (16 + 128 + 1 + 1, 3 * 146 + 16 + 1) == (146, pools["swa"]["tokens"])
    assert pools["full"]["tokens"] == 2000
    assert any(line.startswith("KV pool sizing: request cap") and "= 455 tokens" in line for line in eng.startup_log)
    eng.generate(input_ids=prompts(), sampling_params=GREEDY)
    load = eng.load()
    assert (load.kv_tokens_available, load.swa_tokens_available) == (2000, 455)  # all freed
    ratio = engine("e2b", max_total_tokens=2000).get_server_info()["kv_pools"]["sizing"]
    assert ratio["mode"] == "ratio" and ratio["request_cap"] is None and "--max-running-requests is not given" in ratio["reason"]
