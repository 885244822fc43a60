"""Benchmark metrics with SGLang bench_serving's formulas.

Over the successful requests after warmup:
* output throughput = completion tokens / duration (duration: first send to last finish);
* TTFT per request; TPOT = (latency - TTFT) / (output tokens - 1), for requests with
  more than one output token; ITL = every gap between text chunks;
* mean / median / p90 / p99 (numpy's linear percentiles), in milliseconds;
* concurrency = sum of latencies / duration;
* accept length = completion tokens / speculative verify passes, when the server reports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from bench.serving.backends import RequestFuncOutput


@dataclass(frozen=True)
class Stat:
    mean: float
    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, xs_s: list[float]) -> "Stat":
        """Seconds in, milliseconds out; NaN when there is nothing to summarise."""
        if not xs_s:
            return cls(float("nan"), float("nan"), float("nan"), float("nan"))
        a = np.asarray(xs_s, dtype=np.float64) * 1000.0
        return cls(float(a.mean()), float(np.median(a)), float(np.percentile(a, 90)), float(np.percentile(a, 99)))


@dataclass(frozen=True)
class BenchmarkMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    concurrency: float
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2e_latency_ms: Stat
    accept_length: float | None

    def to_json(self) -> dict:
        return asdict(self)


def tpot_of(o: RequestFuncOutput) -> float | None:
    return (o.latency - o.ttft) / (o.output_len - 1) if o.output_len > 1 else None


def calculate_metrics(outputs: list[RequestFuncOutput], duration_s: float, server_accept_length: float | None = None) -> BenchmarkMetrics:
    ok = [o for o in outputs if o.success]
    if duration_s <= 0:
        raise ValueError(f"benchmark duration must be positive, got {duration_s}")
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    tpots = [t for t in (tpot_of(o) for o in ok) if t is not None]
    verify = [o for o in ok if o.spec_verify_ct]
    accept = server_accept_length
    if accept is None and verify:
        accept = sum(o.output_len for o in verify) / sum(o.spec_verify_ct or 0 for o in verify)
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        duration_s=duration_s,
        total_input=total_in,
        total_output=total_out,
        request_throughput=len(ok) / duration_s,
        input_throughput=total_in / duration_s,
        output_throughput=total_out / duration_s,
        total_throughput=(total_in + total_out) / duration_s,
        concurrency=sum(o.latency for o in ok) / duration_s,
        ttft_ms=Stat.of([o.ttft for o in ok]),
        tpot_ms=Stat.of(tpots),
        itl_ms=Stat.of([x for o in ok for x in o.itl]),
        e2e_latency_ms=Stat.of([o.latency for o in ok]),
        accept_length=accept,
    )
