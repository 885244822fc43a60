"""Kernel tests: shapes stay tiny because on CPU every Triton kernel runs under the interpreter."""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (TRITON_INTERPRET before any kernel is defined)
