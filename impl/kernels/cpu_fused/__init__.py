"""Fused float32 CPU kernels for one decoder layer, a C++ extension built on first use.

Why: on a CPU every ATen op costs microseconds of dispatch, allocation and iterator setup, and a
decode step of the tiny Gemma-4 runs about 45 of them per layer on ``[batch, 64]`` tensors (a
TorchScript'd layer body is only 10% faster, so the cost is in ATen, not in Python). Two kernels
replace them: ``attn_pre`` (input RMSNorm, fused q/k/v projection, head norms, RoPE) and
``decoder_post`` (o_proj, post-attention norm and residual, MLP, PLE gate, layer scalar). The
matmuls and GELU stay ATen calls; the row-local work runs as plain loops.

``reference.py`` holds the same computation in torch (the eager model path); the unit tests compare
the two. Results match to float32 rounding (the sum of squares in RMSNorm is accumulated in a
different order), not bit for bit.

Building needs a C++ compiler and ninja (``pip install ninja``). ``load()`` returns None, after
one warning, when either is missing or the build fails, and the model keeps its torch path;
``IMPL_CPU_FUSED=0`` turns the kernels off. The build lands in torch's extension cache
(``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) under a name that hashes the
source, flags, CPU and torch version, so ``-march=native`` code never runs on another CPU.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import threading
import time
from types import ModuleType

import torch

logger = logging.getLogger("impl.kernels")

ENV_SWITCH = "IMPL_CPU_FUSED"
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_layer.cpp")
# -ffp-contract=off: no FMA may fuse a product into an add (RoPE's x*cos + rot*sin rounds both products).
_CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp-simd"]

_STALE_LOCK_S = 600.0

_lock = threading.Lock()
_module: ModuleType | None = None
_tried = False
_error: str | None = None


def enabled_by_env() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def load() -> ModuleType | None:
    """The compiled extension, or None (disabled, no toolchain, or the build failed: see ``error()``)."""
    global _module, _tried, _error
    if not enabled_by_env():
        return None
    with _lock:
        if _tried:
            return _module
        _tried = True
        try:
            _module = _build()
        except Exception as e:  # no compiler / ninja, or a failed build: the torch path still works
            _error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            logger.warning("fused CPU kernels unavailable (%s); decoder layers use the torch path", _error)
        return _module


def error() -> str | None:
    return _error


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load as load_extension

    if shutil.which("ninja") is None:
        try:  # the PyPI ninja package ships the binary beside the interpreter's scripts
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError as e:
            raise RuntimeError("ninja is not installed (pip install ninja)") from e
    with open(_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(
        source + " ".join(_CFLAGS).encode() + _cpu_id().encode() + torch.__version__.encode()
    ).hexdigest()[:16]
    name = f"impl_cpu_fused_{key}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions", f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    )
    build_dir = os.path.join(root, name)
    os.makedirs(build_dir, exist_ok=True)
    _clear_stale_lock(os.path.join(build_dir, "lock"))
    return load_extension(name=name, sources=[_SOURCE], extra_cflags=_CFLAGS, build_directory=build_dir, verbose=False)


def _clear_stale_lock(path: str) -> None:
    """torch waits forever on a build lock left by a process killed mid-build; a build takes ~20 s,
    so a lock older than ``_STALE_LOCK_S`` is such a leftover and goes."""
    try:
        age = time.time() - os.path.getmtime(path)
    except OSError:
        return
    if age > _STALE_LOCK_S:
        logger.warning("removing a stale extension build lock (%.0f s old): %s", age, path)
        try:
            os.remove(path)
        except OSError:
            pass


def _cpu_id() -> str:
    """The CPU model and feature flags (``-march=native`` code is only valid on the same kind of CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def usable_for(*tensors: torch.Tensor) -> bool:
    """True when the fused kernels can serve these tensors (CPU float32)."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
