"""glibc's allocator told to keep the memory a forward frees, for the next forward.

A prefill allocates and frees tens of MB per layer (matmul outputs, the MLP's gate / up products: E2B's [1024,
12288] float32 is 50 MB). glibc returns a freed block above its mmap threshold (dynamic, 128 KB rising to at most
32 MB) to the kernel at once, and trims the heap's free top beyond its trim threshold; the next forward then
takes a page fault per 4 KB it writes. Measured on the AMX Xeon (E2B full size, in process): 85-140 thousand
faults per 4 x 1024-token (a) round with bf16 weights, and a W4A8 process that took 15 thousand per 1024-token
prefill ran it in 1.50 s against 1.27 s with this setting (another process of the same build started without the
faults: glibc's thresholds follow the history of the allocations). With both thresholds at 1 GiB the faults
per round fall to ~20; the peak RSS rose by at most 0.1 GB with bf16 and int4 weights, by 0.3-0.5 GB with W8A8
(the arenas keep the float32 buffers a forward frees), while W8A8's (a) went 10.96 / 11.33 -> 11.93 / 11.47 tok/s. Setting the trim threshold alone would switch the dynamic mmap threshold off at 128 KB: a
million faults per round, so both are set. ``IMPL_MALLOC_KEEP=0`` leaves glibc's defaults (other C libraries
are left alone). SGLang's CPU guide reaches the same end by preloading tcmalloc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from impl.envs import envs

_M_TRIM_THRESHOLD = -1  # malloc.h
_M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # both thresholds (mallopt takes an int)

_applied: str | None = None


def keep_freed_memory() -> str:
    """Apply the setting once per process; the startup line that says what the allocator does."""
    global _applied
    if _applied is not None:
        return _applied
    if not envs.IMPL_MALLOC_KEEP.get():
        _applied = "Allocator: glibc's defaults (IMPL_MALLOC_KEEP=0)"
        return _applied
    libc_name = platform.libc_ver()[0]
    path = ctypes.util.find_library("c") if libc_name == "glibc" else None
    if path is None:
        _applied = f"Allocator: the C library's defaults ({libc_name or 'not glibc'})"
        return _applied
    mallopt = ctypes.CDLL(path).mallopt
    ok = mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES) == 1
    _applied = ("Allocator: glibc keeps freed memory for reuse (mmap and trim thresholds 1 GiB; IMPL_MALLOC_KEEP=0 "
                "for its defaults)" if ok else "Allocator: glibc's defaults (mallopt refused the thresholds)")
    return _applied


def release_freed_memory() -> bool:
    """Hand what glibc keeps back to the kernel (``malloc_trim(0)``: the free pages of every arena), after a
    one-off free of a large set that the next forwards will not reuse (the old weights after a weight update,
    ``impl/engine/control.py``: without it the process's RSS keeps both sets). True when glibc released memory;
    False elsewhere (another C library)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    path = ctypes.util.find_library("c")
    return path is not None and ctypes.CDLL(path).malloc_trim(0) == 1
