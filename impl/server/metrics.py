"""Prometheus metrics in the text exposition format (0.0.4), written by hand.

Names follow SGLang's (``sglang:prompt_tokens_total``, ``sglang:time_to_first_token_seconds``,
...) so existing dashboards and scrapers work; what only this engine has is
under ``yoco:`` (rows fast prefill skipped in the cross-decoder). Finished
requests are recorded on the detokenizer thread (``observe_finished``); gauges
and engine counters are read when ``/metrics`` is scraped.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field
from typing import Callable

from impl.engine.load import LoadView

# SGLang's default buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last: +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.total += v
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cum = [], 0
        for le, c in zip([*map(_num, self.buckets), "+Inf"], self.counts):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cum}')
        out.append(f"{name}_sum{{{labels}}} {_num(self.total)}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


def _num(v: float) -> str:
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return "+Inf" if v > 0 else ("-Inf" if v < 0 else "NaN")
    return repr(float(v)) if isinstance(v, float) else str(v)


@dataclass
class Gauges:
    """Read at scrape time from the engine."""

    load: Callable[[], LoadView]
    work_counters: Callable[[], dict[str, int]]
    spec_stats: Callable[[], dict[str, float]] | None = None  # speculative decoding totals (None: off)


class ServerMetrics:
    def __init__(self, model_name: str, gauges: Gauges):
        self.model_name = model_name
        self.gauges = gauges
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.aborted_requests = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def observe_finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, aborted: bool,
                         ttft: float | None, e2e: float) -> None:
        with self._lock:
            self.requests += 1
            self.aborted_requests += int(aborted)
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.cached_tokens += cached_tokens
            self.e2e.observe(e2e)
            if ttft is not None:
                self.ttft.observe(ttft)
                if completion_tokens > 1:
                    self.tpot.observe((e2e - ttft) / (completion_tokens - 1))

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def render(self) -> str:
        labels = f'model_name="{_escape(self.model_name)}"'
        g = self.gauges
        work = g.work_counters()
        load = g.load()
        out: list[str] = []

        def metric(name: str, kind: str, help: str, value: float | None = None, hist: Histogram | None = None) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")
            if hist is not None:
                out.extend(hist.lines(name, labels))
            else:
                assert value is not None, f"metric {name}: a value or a histogram"
                out.append(f"{name}{{{labels}}} {_num(value)}")

        with self._lock:
            metric("sglang:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", self.prompt_tokens)
            metric("sglang:generation_tokens_total", "counter", "Generated tokens of finished requests.",
                   self.generation_tokens)
            metric("sglang:cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
                   self.cached_tokens)
            metric("sglang:num_requests_total", "counter", "Finished requests (aborted included).", self.requests)
            metric("sglang:num_aborted_requests_total", "counter", "Aborted requests.", self.aborted_requests)
            metric("sglang:cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens, since start.",
                   self.cache_hit_rate)
            metric("sglang:time_to_first_token_seconds", "histogram", "Time to first token.", hist=self.ttft)
            metric("sglang:time_per_output_token_seconds", "histogram", "Time per output token after the first.",
                   hist=self.tpot)
            metric("sglang:e2e_request_latency_seconds", "histogram", "End-to-end request latency.", hist=self.e2e)
        metric("sglang:num_running_reqs", "gauge", "Requests in the running batch.", load.num_running_reqs)
        metric("sglang:num_queue_reqs", "gauge", "Requests waiting to be scheduled.", load.num_waiting_reqs)
        metric("sglang:token_usage", "gauge", "Fraction of KV-cache slots in use (not free, not evictable).",
               load.token_usage)
        metric("yoco:forwards_total", "counter", "Model forwards.", work.get("forwards", 0))
        metric("yoco:fast_prefill_forwards_total", "counter", "Forwards that ran the KV-sharing fast-prefill split.",
               work.get("fast_prefill_forwards", 0))
        metric("yoco:skipped_cross_decoder_rows_total", "counter",
               "Rows KV-sharing fast prefill did not run through the cross-decoder layers.",
               work.get("skipped_cross_decoder_rows", 0))
        if g.spec_stats is not None:
            spec = g.spec_stats()
            metric("sglang:spec_accept_length", "gauge",
                   "Mean tokens committed per speculative verify (accepted drafts + 1), since start.",
                   spec["avg_spec_accept_length"])
            metric("sglang:spec_draft_tokens_total", "counter", "Draft tokens proposed.", spec["draft_tokens"])
            metric("sglang:spec_accepted_draft_tokens_total", "counter", "Draft tokens accepted.", spec["accepted_drafts"])
            metric("sglang:spec_verify_tokens_total", "counter", "Rows verified by the target (bonus + drafts).",
                   spec["verify_tokens"])
            metric("sglang:spec_verify_ct_total", "counter", "Request-verifies (one per request per round).",
                   spec["verify_ct"])
        return "\n".join(out) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_metrics(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of a text exposition (for tests and contracts)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out
