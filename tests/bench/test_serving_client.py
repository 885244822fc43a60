"""The serving load generator (bench/serving): SGLang bench_serving's definitions on small data."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from bench.serving.backends import RequestFuncOutput
from bench.serving.cli import main as cli_main
from bench.serving.datasets import random_ids
from bench.serving.metrics import calculate_metrics
from bench.serving.presets import PRESETS
from bench.serving.runner import benchmark


def test_random_ids_lengths_seed_and_range():
    a = random_ids(20, 64, 16, 0.5, 1000, seed=1)
    b = random_ids(20, 64, 16, 0.5, 1000, seed=1)
    assert a == b and random_ids(20, 64, 16, 0.5, 1000, seed=2) != a
    assert all(32 <= r.prompt_len <= 64 and 8 <= r.output_len <= 16 and len(r.prompt_ids) == r.prompt_len for r in a)
    assert len({r.prompt_len for r in a}) > 1
    fixed = random_ids(3, 10, 4, 1.0, 50, seed=1, min_id=16)
    assert all(r.prompt_len == 10 and r.output_len == 4 and min(r.prompt_ids) >= 16 and max(r.prompt_ids) < 50 for r in fixed)
    ids = fixed[0].prompt_ids  # consecutive ids from a random offset, wrapping inside [min_id, vocab)
    assert all((y - x) % 34 == 1 for x, y in zip(ids, ids[1:]))


def test_bad_dataset_settings_are_refused():
    with pytest.raises(ValueError, match="range-ratio"):
        random_ids(2, 8, 8, 1.5, 100, seed=1)
    with pytest.raises(ValueError, match="scale"):
        PRESETS["summ"].scaled(0)


def test_presets_scale():
    s = PRESETS["summ"].scaled(1 / 64)
    assert (s.input_len, s.output_len, s.num_prompts, s.warmup_requests, s.seed) == (128, 16, 80, 2, 1)
    assert PRESETS["chat"].scaled(1 / 2048).input_len == 1  # never below one token


def _out(ttft, latency, n, itl=(), ok=True, start=0.0, verify=None):
    return RequestFuncOutput(success=ok, ttft=ttft, latency=latency, output_len=n, prompt_len=10, itl=list(itl),
                             start_time=start, spec_verify_ct=verify)


def test_metrics_formulas():
    outs = [_out(0.1, 1.1, 11, [0.1] * 10, verify=5), _out(0.3, 0.3, 1), _out(0.2, 2.2, 5, [0.5] * 4, verify=2),
            _out(0, 0, 0, ok=False)]
    m = calculate_metrics(outs, duration_s=2.0)
    assert (m.completed, m.failed, m.total_output, m.total_input) == (3, 1, 17, 30)
    assert m.output_throughput == pytest.approx(8.5)
    assert m.ttft_ms.median == pytest.approx(200.0)
    # TPOT = (latency - ttft) / (tokens - 1), only for requests with more than one token: 100 ms and 500 ms
    assert m.tpot_ms.mean == pytest.approx(300.0) and m.tpot_ms.median == pytest.approx(300.0)
    assert m.itl_ms.median == pytest.approx(100.0) and m.itl_ms.p99 == pytest.approx(500.0)
    assert m.concurrency == pytest.approx((1.1 + 0.3 + 2.2) / 2.0)
    assert m.accept_length == pytest.approx((11 + 5) / (5 + 2))
    assert calculate_metrics(outs, 2.0, server_accept_length=3.5).accept_length == 3.5
    assert math.isnan(calculate_metrics([_out(0, 0, 0, ok=False)], 1.0).tpot_ms.median)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_every_backend_against_our_server(url, backend):
    rows = random_ids(3, 12, 4, 1.0, 200, seed=1, min_id=16)
    texts = ["Tell me about the sea."] * 3 if backend == "sglang-oai-chat" else None
    res = asyncio.run(benchmark(url, backend, "default", rows, warmup_rows=rows[:1], max_concurrency=2, texts=texts,
                                warmup_texts=texts[:1] if texts else None, progress=False))
    m = res.metrics
    assert m.completed == 3 and m.failed == 0, [o.error for o in res.outputs]
    assert m.total_output == 12  # ignore_eos: exactly the requested tokens, counted by the server
    assert all(0 < o.ttft <= o.latency for o in res.outputs)
    assert len(res.warmup) == 1 and res.warmup[0].success
    assert m.accept_length is None  # no speculative decoding here


def test_cli_writes_jsonl_and_reports(url, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = cli_main(["--base-url", url, "--scenario", "chat", "--scale", str(1 / 256), "--num-prompts", "3",
                   "--warmup-requests", "1", "--request-rate", "50", "--max-concurrency", "2", "--output-file",
                   str(out), "--tag", "t", "--output-details", "--disable-tqdm"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "chat 4/4 (scale 0.00390625)" in text and "Output token throughput (tok/s)" in text
    rec = json.loads(out.read_text().splitlines()[-1])
    assert (rec["tag"], rec["scenario"], rec["random_input_len"], rec["num_prompts"], rec["completed"]) == ("t", "chat", 4, 3, 3)
    assert len(rec["requests"]) == 3 and rec["total_output"] == 12


def test_failed_requests_are_counted_not_raised(url):
    rows = random_ids(2, 8, 4, 1.0, 200, seed=1, min_id=16)
    res = asyncio.run(benchmark(url, "sglang", "default", rows, extra_body={"sampling_params": {"max_new_tokens": -5}},
                                progress=False))
    assert res.metrics.failed == 2 and "HTTP 400" in res.outputs[0].error
