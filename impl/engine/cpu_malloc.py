"""glibc's malloc tuned for a CPU forward's activations (``Engine`` applies it once the model and the KV pool exist).

Why: a CPU forward allocates and frees activations of megabytes per layer (a 1024-row prefill of E2B: its MLP
blocks, its [1024, 2560] q/k/v projection, float32 copies of the hidden state). glibc serves a block above its
mmap threshold (128 KB, raised on the fly to at most 32 MB) with fresh pages from ``mmap`` and gives a freed heap
top above 128 KB back to the system, so those tensors arrive as new pages again and again: a minor page fault per
4 KB page and the kernel zeroing it. Measured on ``e2b-full-wc`` (bf16, the flag on, one fresh 1024-token
prompt, in process on a 2-core Xeon): 40,000-69,000 minor faults per prefill with glibc's defaults, 2 with the
thresholds below. vLLM's CPU backend preloads tcmalloc for the same reason; ``mallopt`` gets it from the allocator
the process already has.

Applied after loading: the loader's temporaries (hundreds of MB) went back to the system as before. From then on
blocks up to ``MMAP_THRESHOLD`` come from the heap and a free heap top of up to ``TRIM_THRESHOLD`` is kept, so the
resident set stays at the activations' peak between forwards instead of shrinking and faulting back
(``Engine.shutdown`` trims it). ``IMPL_GLIBC_MALLOC_TUNING=0`` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

from impl.envs import envs

logger = logging.getLogger(__name__)

MMAP_THRESHOLD = 256 << 20  # bytes: blocks up to this come from the heap (a 2048-row chunk's largest activation: 100 MB)
TRIM_THRESHOLD = 1 << 30  # bytes: a free heap top up to this stays mapped
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h

_applied = False


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def tune_glibc_malloc() -> str:
    """Set the thresholds (once per process); returns the startup log's line saying what holds."""
    global _applied
    switch = envs.IMPL_GLIBC_MALLOC_TUNING
    if not switch.get():
        return f"glibc malloc: defaults ({switch.name}=0)"
    libc = _libc()
    if libc is None:
        return "glibc malloc: not glibc, nothing tuned"
    if not _applied:
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        if not ok:
            return "glibc malloc: defaults (mallopt refused the thresholds)"
        _applied = True
    return (f"glibc malloc: activations up to {MMAP_THRESHOLD >> 20} MB reuse heap pages (no page faults per "
            f"forward; freed heap kept up to {TRIM_THRESHOLD >> 20} MB; {switch.name}=0 for glibc's defaults)")


def trim() -> None:
    """Give the heap's free pages back to the system (an engine shut down in a process that goes on)."""
    libc = _libc() if _applied else None
    if libc is not None:
        libc.malloc_trim(0)
