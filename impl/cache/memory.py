"""Memory: will the model fit (before loading), how many KV token slots the pool gets, and RSS.

KV budget (``kv_budget``, after the weights are loaded):

* ``--max-total-tokens N``: exactly N usable slots (the pool has N + 1; slot 0 is the pad).
* ``--mem-fraction-static f`` given: ``f`` of the memory available before the weights were loaded goes to
  weights plus KV cache: ``slots = (f * (available_now + weight_bytes) - weight_bytes) / bytes_per_token``
  (SGLang's meaning; the CUDA default is 0.85).
* neither, on CPU: ``CPU_KV_SHARE`` of the memory still available once the weights are in, at most
  ``CPU_DEFAULT_MAX_TOKENS`` slots. Host memory is shared with everything else, so the default never
  takes the machine, but it is sized from what is left after the weights: a fixed fraction of the
  whole (the former 0.3) cannot hold a model larger than that fraction (Gemma-4 E2B: 8.6 GiB of bf16
  weights on a 24 GB machine), while the model it is asked to serve must always start.

Fit check (``check_fits``, before any weight is read): the loaded weights (``loader.WeightPlan``: in
memory, not the memory-mapped tables), the smallest useful KV pool and working memory for one prefill
chunk must fit in the available memory, else a ValueError names the bytes needed, the bytes available
and the flags that reduce the need (never an OOM kill half-way through loading).

``process_memory()``: the process's RSS and peak RSS (``VmRSS`` / ``VmHWM``), for the startup log and
``/get_server_info``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

CPU_DEFAULT_MAX_TOKENS = 65536
CPU_KV_SHARE = 0.5  # of the memory available after loading, when no KV flag is given on CPU
CUDA_MEM_FRACTION = 0.85  # --mem-fraction-static unset on CUDA (SGLang's default)
MIN_KV_TOKENS = 4096  # the smallest pool the fit check asks room for (or the context length, if shorter)
WORKING_BASE_BYTES = 256 * 1024**2  # interpreter, tokenizer, allocator slack


@dataclass(frozen=True)
class KVBudget:
    num_tokens: int  # usable slots
    reason: str  # how it was chosen, for the startup log

    @property
    def capacity(self) -> int:
        """Pool rows including the reserved pad slot 0."""
        return self.num_tokens + 1


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def process_memory() -> tuple[int, int]:
    """(RSS, peak RSS) of this process in bytes (``/proc/self/status``; (0, 0) where there is none).
    RSS counts resident pages of memory-mapped files too (the touched rows of a mapped table)."""
    rss = peak = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, peak


def gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemoryNeed:
    """What serving a model needs at least, in bytes."""

    weights: int  # weights in memory once loaded
    kv_tokens: int  # the smallest pool asked for
    kv_bytes_per_token: int
    working: int  # activations of one prefill chunk + fixed slack

    @property
    def kv(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.working


def working_bytes(chunk_tokens: int, hidden: int, intermediate: int, ple_width: int) -> int:
    """Activations of one ``chunk_tokens`` prefill step in float32 (the widest buffers at once: the MLP's
    gate/up output and its product, the per-layer inputs, a few hidden-size temporaries)."""
    per_token = 4 * (3 * intermediate + ple_width + 8 * hidden)
    return WORKING_BASE_BYTES + max(chunk_tokens, 1) * per_token


def check_fits(need: MemoryNeed, device: torch.device, what: str, hints: list[str]) -> int:
    """Raise ValueError when ``need`` exceeds the available memory; returns the bytes available."""
    avail = available_memory_bytes(device)
    if need.total <= avail:
        return avail
    where = "GPU memory" if device.type == "cuda" else "host memory (MemAvailable)"
    raise ValueError(
        f"{what} does not fit: it needs {need.total} bytes ({gib(need.total)}): weights {gib(need.weights)}, "
        f"a KV pool of at least {need.kv_tokens} tokens x {need.kv_bytes_per_token} bytes = {gib(need.kv)}, "
        f"working memory {gib(need.working)}; {avail} bytes ({gib(avail)}) of {where} are available. "
        "Flags that reduce what it needs: " + "; ".join(hints) + ". Or free memory held by other processes."
    )


def kv_budget(
    bytes_per_token: int,
    device: torch.device,
    weight_bytes: int,
    max_total_tokens: int | None = None,
    mem_fraction_static: float | None = None,
) -> KVBudget:
    if max_total_tokens is not None:
        if max_total_tokens < 1:
            raise ValueError(f"--max-total-tokens must be at least 1, got {max_total_tokens}")
        return KVBudget(max_total_tokens, "--max-total-tokens")
    kind = "cuda" if device.type == "cuda" else "cpu"
    avail = available_memory_bytes(device)
    if kind == "cpu" and mem_fraction_static is None:
        share = int(CPU_KV_SHARE * avail)
        tokens = min(CPU_DEFAULT_MAX_TOKENS, share // max(bytes_per_token, 1))
        reason = (f"CPU default: {CPU_KV_SHARE} of the {avail / 2**30:.1f} GiB available after loading, "
                  f"at most {CPU_DEFAULT_MAX_TOKENS} tokens")
        if tokens < 1:
            raise ValueError(
                f"no memory is left for the KV cache: {CPU_KV_SHARE} of the {gib(avail)} available after loading "
                f"{gib(weight_bytes)} of weights holds no token of {bytes_per_token} bytes. Pass --max-total-tokens, "
                "or free memory."
            )
        return KVBudget(tokens, reason)
    frac = CUDA_MEM_FRACTION if mem_fraction_static is None else mem_fraction_static
    if not 0.0 < frac < 1.0:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    budget = frac * (avail + weight_bytes) - weight_bytes
    tokens = int(budget // max(bytes_per_token, 1))
    reason = f"--mem-fraction-static {frac} of {avail / 2**30:.1f} GiB available"
    if tokens < 1:
        raise ValueError(
            f"no memory is left for the KV cache: --mem-fraction-static {frac} of {avail / 2**30:.2f} GiB available "
            f"does not cover the {weight_bytes / 2**30:.2f} GiB of weights. Raise --mem-fraction-static, pass "
            "--max-total-tokens, or leave both unset on CPU (the default sizes the pool from what the weights leave)."
        )
    return KVBudget(tokens, reason)
