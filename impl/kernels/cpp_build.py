"""Build a C++ torch extension on first use: the helper the CPU kernel packages share.

``build_extension(prefix, sources, cflags)`` compiles C++ sources with ninja into torch's
extension cache (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) under a name that
hashes the source, the flags, the CPU model and flags and the torch version, so ``-march=native``
code never runs on another CPU and an edit rebuilds. It raises when ninja or a compiler is
missing or the build fails; callers turn that into one warning and their torch path.
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

from impl.envs import EnvVar, envs

logger = logging.getLogger("impl.kernels")

# A build takes ~20-60 s; a lock older than this was left by a process killed mid-build.
STALE_LOCK_S = 600.0
# The target CPU of the builds (gcc's -march): native by default; e.g. IMPL_CPU_MARCH=haswell builds (and
# runs) the AVX2 code on an AVX-512 machine, to check that path against the references.
ENV_MARCH = envs.IMPL_CPU_MARCH.name


def march() -> str:
    """The ``-march`` the C++ extensions are built for (``IMPL_CPU_MARCH``, default ``native``): it replaces
    the ``-march=native`` of their flags."""
    return envs.IMPL_CPU_MARCH.get()


def build_extension(prefix: str, source: str | list[str], cflags: list[str]) -> ModuleType:
    """``source``: one C++ file, or several (the first builds the module; headers beside them, ``*.h``
    in the same folders, and the headers shared by every extension in ``impl/kernels/`` count for the hash
    too)."""
    from torch.utils.cpp_extension import load as load_extension

    sources = [source] if isinstance(source, str) else list(source)
    cflags = [f"-march={march()}" if f == "-march=native" else f for f in cflags]  # IMPL_CPU_MARCH
    if envs.IMPL_CPU_AMX_EMULATE.get():  # the AMX paths with the tiles in software (impl/kernels/cpu_amx_emulate.h)
        cflags = cflags + ["-DIMPL_AMX_EMULATE"]

    if shutil.which("ninja") is None:
        try:  # the PyPI ninja package ships the binary beside the interpreter's scripts
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError as e:
            raise RuntimeError("ninja is not installed (pip install ninja)") from e
    text = b""
    folders = {os.path.dirname(p) for p in sources} | {os.path.dirname(os.path.abspath(__file__))}
    headers = sorted({os.path.join(d, n) for d in folders for n in os.listdir(d) if n.endswith(".h")})
    for path in sources + headers:
        with open(path, "rb") as f:
            text += f.read()
    # sys.prefix: torch's build rules embed the interpreter's paths, so two virtualenvs sharing one extension
    # folder would rebuild each other's module (and wait on each other's build lock) on every start.
    key = hashlib.sha256(text + " ".join(cflags).encode() + cpu_id().encode() + torch.__version__.encode()
                         + sys.prefix.encode()).hexdigest()
    name = f"{prefix}_{key[:16]}"
    root = envs.TORCH_EXTENSIONS_DIR.get() or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions", f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    )
    build_dir = os.path.join(root, name)
    os.makedirs(build_dir, exist_ok=True)
    clear_stale_lock(os.path.join(build_dir, "lock"))
    # -fopenmp must reach the link too: at::parallel_for is an inline `#pragma omp parallel` in ATen's
    # headers, so without it every "parallel" loop of the extension runs on the calling thread alone.
    # The module then needs libgomp.so.1, which resolves to the copy torch already loaded (one runtime).
    ldflags = ["-fopenmp"] if "-fopenmp" in cflags else []
    return load_extension(name=name, sources=sources, extra_cflags=cflags, extra_ldflags=ldflags,
                          build_directory=build_dir, verbose=False)


def clear_stale_lock(path: str) -> None:
    """torch waits forever on a build lock left by a process killed mid-build: remove an old one."""
    try:
        age = time.time() - os.path.getmtime(path)
    except OSError:
        return
    if age > STALE_LOCK_S:
        logger.warning("removing a stale extension build lock (%.0f s old): %s", age, path)
        try:
            os.remove(path)
        except OSError:
            pass


def cpu_id() -> str:
    """The CPU model and feature flags (``-march=native`` code is only valid on the same kind of CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


class LazyExtension:
    """One C++ extension, built at most once per process on first ``load()``.

    ``load()`` returns the module, or None when ``env_switch`` (a boolean variable) turns it off or the build failed; a
    failure is logged once (``fallback`` says what runs instead) and kept in ``error()``. ``build``
    is an attribute so tests can replace it with one that fails.
    """

    def __init__(self, prefix: str, source: str | list[str], cflags: list[str], env_switch: EnvVar[bool], what: str,
                 fallback: str):
        self.prefix, self.source, self.cflags = prefix, source, cflags
        self.env_switch, self.what, self.fallback = env_switch, what, fallback
        self._lock = threading.Lock()
        self._module: ModuleType | None = None
        self._tried = False
        self._error: str | None = None

    def build(self) -> ModuleType:
        return build_extension(self.prefix, self.source, self.cflags)

    def enabled_by_env(self) -> bool:
        return self.env_switch.get()

    def load(self) -> ModuleType | None:
        """The compiled extension, or None (disabled, no toolchain, or the build failed: see ``error()``)."""
        if not self.enabled_by_env():
            return None
        with self._lock:
            if self._tried:
                return self._module
            self._tried = True
            try:
                self._module = self.build()
            except Exception as e:  # no compiler / ninja, or a failed build: the caller's torch path still works
                msg = str(e).strip()
                self._error = f"{type(e).__name__}: {msg.splitlines()[-1] if msg else ''}"
                logger.warning("%s unavailable (%s); %s", self.what, self._error, self.fallback)
            return self._module

    def loaded(self) -> ModuleType | None:
        """The module if an earlier ``load`` built it; never builds (for clean-up paths)."""
        return self._module

    def error(self) -> str | None:
        return self._error
