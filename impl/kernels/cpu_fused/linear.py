"""Which library multiplies the fused layers' weights on CPU: oneDNN (prepacked or plain) or ATen's mm.

Why: ATen's float32 ``mm`` on CPU is MKL's sgemm, which keeps to its AVX2 code off Intel CPUs; oneDNN
(``mkldnn::_linear_pointwise``, what vLLM's CPU build and Inductor use) dispatches on the CPU's own ISA
and runs the layer shapes 2-4x faster on an AVX-512 AMD core, and no slower under AVX2
(``bench/bench_cpu_linear.py``; table in docs/benchmarks.md). It also fuses GELU-tanh and the gating
multiply into the MLP matmuls. Its fixed cost per call (~10 us) loses on tiny weights, so weights
under ``MIN_WEIGHT_ELEMS`` stay on ``mm`` (the tiny test checkpoints: hidden 64).

Modes (``IMPL_CPU_LINEAR``; default ``auto``):

* ``packed``: weights reordered once into oneDNN's blocked layout (an opaque ``mkldnn`` tensor beside the
  model's plain parameter: the layer weights are held twice);
* ``onednn``: oneDNN on the plain weights (reordered per call: ~20-30% slower than packed, no copy);
* ``mkl``: ATen's ``mm`` (the model file's own numerics);
* ``auto``: ``packed`` when the copies fit in ``PACK_RAM_FRACTION`` of the machine's RAM, else ``onednn``;
  ``mkl`` when torch has no oneDNN. Per layer, weights under ``MIN_WEIGHT_ELEMS`` keep ``mkl``.

oneDNN's float32 results differ from MKL's in rounding (summation order), not in precision.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ENV = "IMPL_CPU_LINEAR"
MODES = ("auto", "packed", "onednn", "mkl")
MIN_WEIGHT_ELEMS = 1 << 16  # 256 x 256: below this a call's fixed cost outweighs the arithmetic
PACK_RAM_FRACTION = 0.25
PACK_BATCH_HINT = 64  # rows oneDNN tunes the packed layout for (any row count still runs)


@dataclass(frozen=True)
class LinearPlan:
    mode: str  # "packed" | "onednn" | "mkl"
    reason: str

    def describe(self) -> str:
        what = {"packed": "oneDNN, prepacked weights", "onednn": "oneDNN, plain weights", "mkl": "ATen mm"}[self.mode]
        return f"{what} ({self.reason})"


def requested_mode() -> str:
    raw = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if raw not in MODES:
        raise ValueError(f"environment variable {ENV}={raw!r} is not one of {', '.join(MODES)}; unset it for 'auto'.")
    return raw


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def plan(packable_bytes: int) -> LinearPlan:
    """The mode for a model whose oneDNN-sized layer weights take ``packable_bytes``."""
    mode = requested_mode()
    if mode == "mkl":
        return LinearPlan("mkl", f"{ENV}=mkl")
    if not onednn_available():
        return LinearPlan("mkl", "torch was built without oneDNN")
    if mode != "auto":
        return LinearPlan(mode, f"{ENV}={mode}")
    ram = _ram_bytes()
    if ram and packable_bytes > PACK_RAM_FRACTION * ram:
        return LinearPlan("onednn", f"a packed copy of {packable_bytes / 2**30:.1f} GiB would exceed "
                                    f"{PACK_RAM_FRACTION:.0%} of RAM")
    return LinearPlan("packed", "auto")


def sized_for_onednn(*weights: torch.Tensor) -> bool:
    """True when every weight is large enough for oneDNN (its fixed cost per call is amortised)."""
    return all(w.numel() >= MIN_WEIGHT_ELEMS for w in weights)


def pack(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] float32 reordered for oneDNN's linear (an opaque ``mkldnn`` tensor, same sizes)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_BATCH_HINT)
