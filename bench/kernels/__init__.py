"""Attention-kernel micro-benchmarks: ``make bench-kernels`` (pytest-benchmark), ``python -m bench.kernels.report``."""
