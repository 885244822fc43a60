"""``--enable-deterministic-inference`` in the engine: a request's tokens and logprobs do not depend on which
requests share its forwards (SGLang's batch invariance), so ``--kv-sharing-fast-prefill`` on and off give
identical greedy tokens under concurrent load too, where the two runs batch the same requests differently.

What varies with the batch without it, and what the mode does (CPU, bf16 weights; measured on the E2B
shapes: ``tests/engine/test_deterministic.py`` keeps the small-shape checks):

* with avx512_bf16 (no AMX), oneDNN's prepacked matmul gives a row the same bits for any batch of 2 to 2048
  rows, but a batch of one row takes its matrix-vector kernel, which rounds differently: the fused layers run
  a lone row (batch-1 decode, a 1-token chunk) as two copies of that row
  (``cpu_fused.transform.apply(batch_invariant=True)``: ``FusedLayerForward``, the one place that knows the
  quirk). On AMX its blocking follows the row count (with K >= 1024 a row of a 44-row batch is summed in
  another order than in a 300-row one): there the fused layers run every kernel call on blocks of exactly
  ``INVARIANT_ROWS`` (64) rows, padded, at some cost in speed (``FusedLayerForward.fixed_rows``).
* the bf16 linears outside the fused layers (the per-layer-input projection) and the LM head switch from the
  extension's row kernel to oneDNN above 16 rows: they take the row kernel at every row count
  (``cpu_fused.transform.apply(batch_invariant=True)``).
* the triton backend's decode kernel splits a long context's keys and merges the parts, which rounds unlike
  the extend kernel that computes the same row inside a prefill batch: no splits
  (``AttentionBackend.deterministic``).

Refused where those guarantees do not hold (each message names the fix): float32 weights (ATen's and MKL's
float32 matmuls vary with the row count), CPUs without native bf16 (the float32-arithmetic bf16 path
switches kernels at 16 rows), a kernel plan other than oneDNN's prepacked one. The argument-side rules
(triton, no speculative decoding, CPU) are ``impl/args/deterministic.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from impl.args.deterministic import FLAG
from impl.kernels import cpu_fused
from impl.kernels.cpu_fused import linear as cpu_linear


def check_supported(dtype: torch.dtype) -> None:
    """Before any weight is read: the dtype and the CPU's kernels can give batch-invariant rows (the device
    is the CPU: ``impl/args/deterministic.py`` refused any other)."""
    if dtype != torch.bfloat16:
        raise ValueError(
            f"{FLAG} needs bf16 weights here (the dtype resolved to {str(dtype).replace('torch.', '')}): the float32 "
            f"matmuls vary with the batch's row count. Serve with --dtype bfloat16 (a bf16 checkpoint's --dtype auto), "
            f"or drop {FLAG}."
        )
    plan = cpu_linear.plan(dtype, batch_invariant=True)
    if plan.mode != "packed":
        raise ValueError(
            f"{FLAG} needs oneDNN's prepacked bf16 matmul, which needs native bf16 arithmetic (avx512_bf16 or AMX) "
            f"and IMPL_CPU_LINEAR unset or 'packed'; this machine would run {plan.describe()}. Drop {FLAG} "
            "on this CPU."
        )
    if cpu_fused.load() is None:
        raise ValueError(f"{FLAG} needs the fused CPU kernels ({cpu_fused.error() or 'IMPL_CPU_FUSED=0'}); drop {FLAG}.")


def check_kernels(kernels: Any) -> None:
    """After the CPU transform: every decoder layer runs the fused kernels on the prepacked matmul, and the LM
    head takes the row kernel (a layer with a weight under oneDNN's size floor keeps the float32-arithmetic
    path, which switches kernels at 16 rows; an LM head that is not bf16 is not on the row kernel)."""
    if kernels is None:
        raise ValueError(f"{FLAG}: no CPU kernels were installed; drop {FLAG}.")
    modes = kernels.layer_linear or ("",) * len(kernels.layer_paths)
    bad = [i for i, (path, mode) in enumerate(zip(kernels.layer_paths, modes)) if path != "fused" or mode != "packed"]
    if bad:
        raise ValueError(
            f"{FLAG} needs every decoder layer on oneDNN's prepacked bf16 matmul, but layers {bad} are not "
            f"({kernels.describe()}): weights under oneDNN's size floor (a tiny checkpoint) take kernels that differ "
            f"by row count. Drop {FLAG} for this model."
        )
    if "project_to_vocab" not in kernels.other_linears:
        raise ValueError(
            f"{FLAG} needs the LM head on the bf16 row kernel, but its weight is not bf16 (the embedding table keeps "
            f"the checkpoint's dtype whatever --dtype says): serve a bf16 checkpoint, or drop {FLAG}."
        )
