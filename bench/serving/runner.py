"""The async benchmark: warmup, then every request at its arrival time, within a concurrency cap.

Arrivals: ``request_rate`` requests per second as a Poisson process (exponential gaps from
numpy seeded with the benchmark seed), or all at once when it is ``inf``. ``max_concurrency``
caps requests in flight (an asyncio semaphore). Warmup requests (the first dataset rows,
run to completion before the clock starts) are excluded from every metric. One
``httpx.AsyncClient`` serves every request; there are no per-request threads.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from bench.serving.backends import BACKENDS, RequestFuncInput, RequestFuncOutput
from bench.serving.datasets import DatasetRow
from bench.serving.metrics import BenchmarkMetrics, calculate_metrics

TIMEOUT = httpx.Timeout(6 * 3600.0, connect=30.0)


@dataclass
class BenchResult:
    metrics: BenchmarkMetrics
    outputs: list[RequestFuncOutput]
    warmup: list[RequestFuncOutput] = field(default_factory=list)


class Progress:
    """A one-line progress bar on stderr (``done/total``, elapsed seconds)."""

    def __init__(self, total: int, label: str, enabled: bool = True):
        self.total, self.label, self.enabled, self.done, self.t0 = total, label, enabled, 0, time.perf_counter()
        self._draw()

    def update(self) -> None:
        self.done += 1
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        w = 30
        fill = w * self.done // max(1, self.total)
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (w - fill)}] {self.done}/{self.total} "
                         f"{time.perf_counter() - self.t0:6.1f}s{end}")
        sys.stderr.flush()


async def _arrivals(n: int, rate: float, seed: int):
    """Yield request indices at Poisson arrival times (all at once for an infinite rate)."""
    rng = np.random.RandomState(seed)
    for i in range(n):
        yield i
        if math.isfinite(rate) and i + 1 < n:
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))


def server_accept_length(base_url: str) -> float | None:
    """SGLang's average speculative accept length from /get_server_info, when the server reports one."""
    try:
        info = httpx.get(base_url + "/get_server_info", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return None
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        v = states[0].get("avg_spec_accept_length")
        return float(v) if isinstance(v, (int, float)) else None
    v = info.get("avg_spec_accept_length") if isinstance(info, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


async def benchmark(
    base_url: str,
    backend: str,
    model: str,
    rows: list[DatasetRow],
    warmup_rows: list[DatasetRow] | None = None,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 1,
    texts: list[str] | None = None,
    warmup_texts: list[str] | None = None,
    extra_body: dict[str, Any] | None = None,
    progress: bool = True,
    label: str = "bench",
) -> BenchResult:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be positive (inf: all at once), got {request_rate}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    fn = BACKENDS[backend]

    def inp(row: DatasetRow, text: str | None) -> RequestFuncInput:
        return RequestFuncInput(base_url, model, row.prompt_ids, row.prompt_len, row.output_len, text, True,
                                dict(extra_body or {}))

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        warm: list[RequestFuncOutput] = []
        if warmup_rows:
            wt = warmup_texts or [None] * len(warmup_rows)
            warm = list(await asyncio.gather(*(fn(client, inp(r, t)) for r, t in zip(warmup_rows, wt))))
            bad = [w for w in warm if not w.success]
            if bad:
                raise RuntimeError(f"warmup request failed: {bad[0].error}")
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bar = Progress(len(rows), label, progress)

        async def one(i: int) -> RequestFuncOutput:
            if sem is None:
                out = await fn(client, inp(rows[i], None if texts is None else texts[i]))
            else:
                async with sem:
                    out = await fn(client, inp(rows[i], None if texts is None else texts[i]))
            bar.update()
            return out

        start = time.perf_counter()
        tasks = []
        async for i in _arrivals(len(rows), request_rate, seed):
            tasks.append(asyncio.create_task(one(i)))
        outputs = list(await asyncio.gather(*tasks))
        duration = max((o.start_time + o.latency for o in outputs), default=start) - start
    accept = await asyncio.get_running_loop().run_in_executor(None, server_accept_length, base_url)
    return BenchResult(calculate_metrics(outputs, duration, accept), outputs, warm)
