"""pytest-benchmark micro-benchmarks of the attention kernels vs torch SDPA (``-m bench``; not part of the tests).

Each benchmark records achieved TFLOP/s and GB/s in ``extra_info`` (work model in attn_bench).
"""

from __future__ import annotations

import pytest

from bench.kernels import attn_bench as ab

pytestmark = pytest.mark.bench

SHAPES = ab.shapes()


def _run(benchmark, fn, s):
    def call():
        fn()
        ab.sync()

    benchmark.pedantic(call, rounds=10 if ab.CUDA else 2, iterations=1, warmup_rounds=2 if ab.CUDA else 1)
    sec = benchmark.stats.stats.mean
    benchmark.extra_info.update(tflops=ab.flops(s) / sec / 1e12, gbps=ab.min_bytes(s) / sec / 1e9)


@pytest.mark.parametrize("s", SHAPES, ids=[s.name for s in SHAPES])
def test_bench_triton(benchmark, s):
    p = ab.Problem(s)
    _run(benchmark, p.ours, s)


@pytest.mark.parametrize("s", [s for s in SHAPES if s.window is None], ids=[s.name for s in SHAPES if s.window is None])
def test_bench_sdpa(benchmark, s):
    p = ab.Problem(s)
    _run(benchmark, p.sdpa, s)
