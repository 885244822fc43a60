"""Command line of the load generator (flag names from SGLang's bench_serving).

    python -m bench.serving --base-url http://127.0.0.1:30000 --scenario summ --scale 0.125
    python -m bench.serving --backend sglang-oai --random-input-len 512 --random-output-len 64 \\
        --num-prompts 16 --request-rate 4 --max-concurrency 8 --output-file out.jsonl

A scenario (``chat``, ``summ``) sets lengths, prompt count, warmup and seed (explicit flags
still win). Results: a table on stdout and, with ``--output-file``, one JSON line appended
per run (SGLang's JSONL habit), per-request figures with ``--output-details``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from typing import Any, Sequence

import httpx

from bench.serving.backends import BACKENDS
from bench.serving.datasets import random_ids
from bench.serving.metrics import BenchmarkMetrics
from bench.serving.presets import PRESETS, Scenario
from bench.serving.runner import BenchResult, benchmark


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="sglang", choices=sorted(BACKENDS))
    p.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default=None, help="model name for the OpenAI routes (default: GET /v1/models)")
    p.add_argument("--dataset-name", default="random-ids", choices=["random-ids"])
    p.add_argument("--scenario", choices=sorted(PRESETS), default=None, help="seed 000 preset: chat 1024/1024, summ 8192/1024")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the input and output lengths (0 < scale <= 1)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=None)
    p.add_argument("--random-output-len", type=int, default=None)
    p.add_argument("--random-range-ratio", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--warmup-requests", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests per second (Poisson); inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (chat backend: decodes prompt ids to text)")
    p.add_argument("--extra-request-body", default=None, help="JSON merged into every request body")
    p.add_argument("--output-file", default=None, help="append one JSON line with the run's settings and metrics")
    p.add_argument("--output-details", action="store_true", help="include per-request TTFT/ITL/latency in the JSON line")
    p.add_argument("--tag", default=None, help="label stored with the JSON line (e.g. the server configuration)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return p


def resolve_scenario(a: argparse.Namespace) -> Scenario:
    base = PRESETS[a.scenario] if a.scenario else Scenario("custom", 1024, 128, num_prompts=16, warmup_requests=1, seed=1)
    s = Scenario(
        base.name,
        a.random_input_len if a.random_input_len is not None else base.input_len,
        a.random_output_len if a.random_output_len is not None else base.output_len,
        a.num_prompts if a.num_prompts is not None else base.num_prompts,
        a.warmup_requests if a.warmup_requests is not None else base.warmup_requests,
        a.seed if a.seed is not None else base.seed,
        a.random_range_ratio if a.random_range_ratio is not None else base.range_ratio,
    )
    return s.scaled(a.scale)


def model_info(base_url: str) -> dict[str, Any]:
    try:
        r = httpx.get(base_url + "/get_model_info", timeout=30)
        return r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def served_model(base_url: str) -> str:
    try:
        return httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return "default"


def load_decoder(path: str | None, info: dict[str, Any]):
    """ids -> text with the model's tokenizer (``--tokenizer`` or the server's local model folder)."""
    folder = path or info.get("tokenizer_path") or info.get("model_path")
    f = os.path.join(folder, "tokenizer.json") if folder else None
    if not f or not os.path.isfile(f):
        raise ValueError(f"the chat backend decodes the random prompt ids to text and needs a tokenizer: pass "
                         f"--tokenizer FOLDER (with tokenizer.json); tried {f!r}")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f)
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def run(a: argparse.Namespace) -> tuple[Scenario, BenchResult, dict[str, Any]]:
    base_url = (a.base_url or f"http://{a.host}:{a.port}").rstrip("/")
    sc = resolve_scenario(a)
    info = model_info(base_url)
    vocab = int(info.get("vocab_size") or 32000)
    rows = random_ids(sc.num_prompts + sc.warmup_requests, sc.input_len, sc.output_len, sc.range_ratio, vocab, sc.seed)
    warm_rows, rows = rows[: sc.warmup_requests], rows[sc.warmup_requests:]
    texts = None
    if a.backend == "sglang-oai-chat":
        dec = load_decoder(a.tokenizer, info)
        texts = [dec(r.prompt_ids) for r in warm_rows + rows]
    extra = json.loads(a.extra_request_body) if a.extra_request_body else None
    model = a.model or served_model(base_url)
    w = len(warm_rows)
    res = asyncio.run(benchmark(
        base_url, a.backend, model, rows, warmup_rows=warm_rows, request_rate=a.request_rate,
        max_concurrency=a.max_concurrency, seed=sc.seed, texts=None if texts is None else texts[w:],
        warmup_texts=None if texts is None else texts[:w], extra_body=extra, progress=not a.disable_tqdm, label=sc.label))
    return sc, res, info


def report(sc: Scenario, scale: float, a: argparse.Namespace, m: BenchmarkMetrics) -> str:
    lines = [
        f"============ Serving Benchmark Result ({a.backend}) ============",
        f"Scenario: {sc.label} (scale {scale:g}), {sc.num_prompts} prompts, warmup {sc.warmup_requests}, seed {sc.seed}, "
        f"range ratio {sc.range_ratio:g}",
        f"Request rate: {a.request_rate}, max concurrency: {a.max_concurrency}",
        f"Successful requests: {m.completed}   failed: {m.failed}",
        f"Benchmark duration (s): {m.duration_s:.2f}",
        f"Total input tokens: {m.total_input}   total generated tokens: {m.total_output}",
        f"Request throughput (req/s): {m.request_throughput:.3f}",
        f"Input token throughput (tok/s): {m.input_throughput:.2f}",
        f"Output token throughput (tok/s): {m.output_throughput:.2f}",
        f"Concurrency: {m.concurrency:.2f}",
    ]
    if m.accept_length is not None:
        lines.append(f"Accept length: {m.accept_length:.2f}")
    for name, st in (("TTFT", m.ttft_ms), ("TPOT", m.tpot_ms), ("ITL", m.itl_ms), ("E2E latency", m.e2e_latency_ms)):
        lines.append(f"{name + ' (ms)':<18} mean {st.mean:10.2f}  median {st.median:10.2f}  p90 {st.p90:10.2f}  p99 {st.p99:10.2f}")
    return "\n".join(lines)


def record(sc: Scenario, scale: float, a: argparse.Namespace, res: BenchResult, info: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "tag": a.tag, "backend": a.backend, "dataset_name": "random-ids", "scenario": sc.name, "scale": scale,
        "random_input_len": sc.input_len, "random_output_len": sc.output_len, "random_range_ratio": sc.range_ratio,
        "num_prompts": sc.num_prompts, "warmup_requests": sc.warmup_requests, "seed": sc.seed,
        "request_rate": a.request_rate if math.isfinite(a.request_rate) else "inf", "max_concurrency": a.max_concurrency,
        "model": info.get("served_model_name") or info.get("model_path"), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **res.metrics.to_json(),
    }
    if a.output_details:
        rec["requests"] = [o.to_json() for o in res.outputs]
    return rec


def main(argv: Sequence[str] | None = None) -> int:
    a = make_parser().parse_args(argv)
    try:
        sc, res, info = run(a)
    except (ValueError, RuntimeError, httpx.HTTPError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(sc, a.scale, a, res.metrics))
    if res.metrics.failed:
        first = next(o for o in res.outputs if not o.success)
        print(f"{res.metrics.failed} request(s) failed; first error: {first.error}", file=sys.stderr)
    if a.output_file:
        with open(a.output_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record(sc, a.scale, a, res, info)) + "\n")
    return 1 if res.metrics.completed == 0 else 0
