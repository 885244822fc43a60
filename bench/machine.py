"""The machine a benchmark ran on, as its report states it."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time

# the instruction-set extensions the CPU kernels choose between (impl/kernels/cpu_fused, cpu_attn)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def cpu_description() -> str:
    """``lscpu``'s model name, the ISA extensions the kernels use and the core count, e.g.
    ``AMD EPYC 9R14 (avx2, avx512f, avx512_bf16, avx512_vnni), 2 cores``."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    name = re.search(r"Model name:\s*(.+)", out)
    flags = set((re.search(r"Flags:\s*(.+)", out) or [None, ""])[1].split())
    isa = [f for f in ISA_FLAGS if f in flags]
    return f"{name[1].strip() if name else 'unknown CPU'} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} cores"


def min_seconds(fn, reps: int) -> float:
    """The fastest of ``reps`` calls of ``fn`` after one warm-up call (on a shared machine the least disturbed)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def copy_bandwidth(reps: int = 3) -> float:
    """Bytes per second of a 1 GiB float32 copy (read plus write counted), fastest of ``reps``."""
    import torch

    buf = torch.empty(2**28, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(buf)
    return 2 * buf.numel() * 4 / min_seconds(lambda: dst.copy_(buf), reps)


def cpu_kind() -> str:
    """The CPU kind a table's rows belong to (a run on one kind never overwrites another's): ``AVX2 only``,
    ``AVX-512``, ``AVX-512 + AMX``."""
    return kind_of_flags(cpu_flags())


def kind_of_flags(flags: set[str]) -> str:
    """``cpu_kind`` of a set of /proc/cpuinfo flag names (also those a benchmark recorded with its results)."""
    if "amx_bf16" in flags or "amx_int8" in flags:
        return "AVX-512 + AMX"
    return "AVX-512" if "avx512f" in flags else ("AVX2 only" if "avx2" in flags else "no AVX2")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln.split(":", 1)[1] for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()
