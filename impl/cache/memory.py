"""KV-cache budget: how many token slots the pool gets.

* ``--max-total-tokens N``: exactly N usable slots (the pool has N + 1; slot 0 is the pad).
* otherwise ``--mem-fraction-static f`` (default 0.85 on CUDA, 0.3 on CPU) of the
  memory available before the weights were loaded goes to weights plus KV cache:
  ``slots = (f * (available_now + weight_bytes) - weight_bytes) / bytes_per_token``.
  On CPU the default (no flag given) is capped at ``CPU_DEFAULT_MAX_TOKENS``: host
  memory is shared with everything else, and a pool that large is rarely useful there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

CPU_DEFAULT_MAX_TOKENS = 65536
DEFAULT_MEM_FRACTION = {"cuda": 0.85, "cpu": 0.3}


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
    frac = DEFAULT_MEM_FRACTION[kind] if mem_fraction_static is None else mem_fraction_static
    if not 0.0 < frac < 1.0:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    avail = available_memory_bytes(device)
    budget = frac * (avail + weight_bytes) - weight_bytes
    tokens = int(budget // max(bytes_per_token, 1))
    reason = f"--mem-fraction-static {frac} of {avail / 2**30:.1f} GiB available"
    if kind == "cpu" and mem_fraction_static is None and tokens > CPU_DEFAULT_MAX_TOKENS:
        tokens, reason = CPU_DEFAULT_MAX_TOKENS, f"CPU default cap ({reason} allows more)"
    if tokens < 1:
        raise ValueError(
            f"no memory is left for the KV cache: --mem-fraction-static {frac} of {avail / 2**30:.2f} GiB available "
            f"does not cover the {weight_bytes / 2**30:.2f} GiB of weights. Raise --mem-fraction-static or pass "
            "--max-total-tokens."
        )
    return KVBudget(tokens, reason)
