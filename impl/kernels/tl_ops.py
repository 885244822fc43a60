"""Small Triton device helpers our kernels use instead of ``triton.language.standard``.

Why: ``tl.max``, ``tl.sum``, ``tl.zeros``, ``tl.cdiv`` ... are ``@jit`` functions
decorated when triton is first imported. torch imports triton on its own (e.g.
``torch._dynamo`` during model construction), possibly before ``triton_env`` set
``TRITON_INTERPRET``; those library functions are then compiled-only and a CPU
(interpreted) kernel calling them fails. Helpers defined here are decorated after
``triton_env``, so they follow the interpreter setting; on GPU they compile to
the same reductions.
"""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import triton
import triton.language as tl


# Reductions go through tl.reduce with the standard library's own combine functions: compiled, that is
# exactly tl.max / tl.min / tl.sum; interpreted, the interpreter recognises these combine functions by
# identity and reduces with numpy (a custom combine function would run element by element in Python),
# and it never calls them, so it does not matter whether they were decorated before TRITON_INTERPRET.
@triton.jit
def reduce_max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@triton.jit
def reduce_min(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_min)


@triton.jit
def reduce_sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def ceil_div(a, b):
    return (a + b - 1) // b


@triton.jit
def tanh(x):
    # tanh(x) = 2 * sigmoid(2x) - 1: exact limits at +-inf, no libdevice needed (works interpreted too).
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
