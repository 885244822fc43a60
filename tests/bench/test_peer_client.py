"""The streaming /v1/completions client of bench_peer / bench_full / bench_kv (``bench.bench_peer.one_request``)
against our server: every generated token counted, the first token's top logprobs, the times, and a failed
request reported in its result."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from bench.bench_peer import Result, one_request
from bench.machine import cpu_description


def test_one_request_counts_tokens_and_reads_the_first_top_logprobs(url):
    out = Result()
    one_request(url, "default", [2, 17, 40, 93, 11], 6, time.perf_counter(), out, logprobs=3)
    assert out.error is None
    assert len(out.ids) == 6 and len(out.tokens) == 6  # ignore_eos: exactly the requested tokens
    assert len(out.first_top) == 3 and [lp for _, lp in out.first_top] == sorted((lp for _, lp in out.first_top), reverse=True)
    assert 0 < out.t_first <= out.t_end


def test_a_refused_request_is_an_error_in_its_result(url):
    out = Result()
    one_request(url, "not-this-model", [2, 17], 2, time.perf_counter(), out)
    assert out.error is not None and out.error.startswith("HTTP 400") and not out.ids


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="no lscpu on this machine")
def test_cpu_description_names_the_model_and_the_cores():
    d = cpu_description()
    assert d.endswith(f"), {os.cpu_count()} cores") and not d.startswith("unknown CPU"), d
