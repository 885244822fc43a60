"""Every environment variable the engine reads, declared once: name, type, default, accepted values.

``envs.IMPL_CPU_FUSED.get()`` reads the variable when called, so a test's
``monkeypatch.setenv`` (or a contract's ``Subject.check(env=...)``) takes effect
at once. Unset or empty is the default; any other value outside the accepted
ones is a ValueError naming the variable, the value and what is accepted (as
SGLang's ``sglang/srt/environ.py``, with stricter parsing: ``IMPL_CPU_FUSED=garbage``
is refused, not read as on). Booleans accept ``1 true yes y on`` and
``0 false no n off`` in any case.

Two prefixes. ``YOCO_``: the project's own switches that mirror SGLang's
``SGLANG_`` ones (the specification maps one prefix onto the other,
``contracts/adapters/sglang_adapter.py``), and the launcher's timeouts and the
checkpoint cache. ``IMPL_``: choices of this implementation's kernels and
weight loading.

=============================  ======  ==========  ==========================================================
variable                       type    default     what it does
=============================  ======  ==========  ==========================================================
YOCO_DISABLE_LAZY_COMPACTION   bool    false       the unified KV pool compacts eagerly (SGLang:
                                                   SGLANG_DISABLE_LAZY_COMPACTION); PD disaggregation with
                                                   --enable-unified-memory then refuses to start (rule K21)
YOCO_SWA_EVICTION_INTERVAL     int     128         tokens leaving a sliding window between two frees of their slots (SGLang:
                                                   SGLANG_SWA_EVICTION_INTERVAL; the hybrid pool without the radix cache)
YOCO_CACHE_DIR                 path    <repo>/.cache  where the embedded tiny checkpoints are built and cached
                                                   (``~/.cache/yoco`` outside a checkout)
YOCO_SERVER_START_TIMEOUT      float   300         seconds ``impl.launch_cluster`` waits for each worker's ready line
YOCO_DP_READY_TIMEOUT          float   600         seconds a ``--dp-size`` front waits for each replica's /health
YOCO_RESPONSES_STORE_MB        int     256         MB of Responses API responses a server keeps in memory for
                                                   previous_response_id and GET /v1/responses/{id}, least recently
                                                   used dropped first (0: none; impl/server/response_store.py)
YOCO_RESPONSES_BACKGROUND_MAX  int     256         Responses API background responses (background: true) a server
                                                   runs unfinished at once; one more is a 429 (0: none;
                                                   impl/server/background_responses.py)
IMPL_TRITON_KERNELS            choice  auto        who runs the triton attention backend's kernels: auto, triton,
                                                   cpu, interpreter, reference (impl/attention/triton_providers.py)
IMPL_CPU_ATTN                  bool    true        build and use the compiled CPU attention kernels (impl/kernels/cpu_attn)
IMPL_CPU_FUSED                 bool    true        build and use the fused CPU layer kernels (impl/kernels/cpu_fused)
IMPL_CPU_LINEAR                choice  auto        the fused layers' matmul route: auto, packed, onednn, mkl
                                                   (impl/kernels/cpu_fused/linear.py)
IMPL_CPU_AMX                   bool    true        AMX tiles where the CPU has them: W8A8 / W4A8 prefill on AMX-int8, bf16
                                                   attention and W8A16 / W4A16 prefill on AMX-bf16 (false: the SIMD kernels,
                                                   AVX512-BF16 where the CPU has it; impl/kernels/cpu_amx.h)
IMPL_CPU_PACKED_DOTS           bool    true        bf16 weights prepacked for oneDNN (native bf16) read in place by the fused kernels'
                                                   bf16 dot products up to 16 rows (false: oneDNN's matmul at every row count;
                                                   impl/kernels/cpu_fused/packed_dot.cpp)
IMPL_QUANT_BF16_DOT            bool    true        a bf16 model's W8A16 / W4A16 prefill (and W4A16's decode, W8A16's from 4
                                                   rows) in bf16 dot products where the CPU has AMX-bf16 or AVX-512 BF16
                                                   (false: float32 blocks for ATen's mm and the float32 row kernel;
                                                   impl/kernels/cpu_fused/quant_linear.cpp)
IMPL_CPU_ATTN_BF16             bool    true        bf16 pair products in the CPU attention kernels (bf16 queries over a bf16 / fp8
                                                   pool): AMX-bf16 tiles, else AVX512-BF16 (false: the float32 SIMD kernels)
IMPL_CPU_ATTN_KEEP_MB          int     512         MB of bf16-pair packed keys the CPU decode kernels keep from one decode step to the
                                                   next (0: pack every request's keys every step; impl/kernels/cpu_attn)
IMPL_CPU_MARCH                 name    native      gcc ``-march`` of both C++ extensions (haswell: the AVX2 code on an
                                                   AVX-512 machine, ``make test-avx2``)
IMPL_CPU_AMX_EMULATE           bool    false       build the C++ extensions with AMX tiles emulated in software, for tests
                                                   of the AMX paths on a CPU without AMX (needs AVX-512 BF16 and VNNI;
                                                   slow; ``make test-amx-emulated``, impl/kernels/cpu_amx_emulate.h)
IMPL_MMAP_EMBEDDINGS           bool    true        serve the per-layer-embedding table zero-copy from the checkpoint file
                                                   on CPU (false: load it into memory)
IMPL_QUANT_LM_HEAD             bool    true        with quantized weights, the LM head reads an int8 (W8A16) copy of the
                                                   tied embedding (false: the embedding's own dtype; impl/quant)
IMPL_QUANT_INT4_SEARCH         bool    true        asymmetric int4 quantized while loading picks each group's range by
                                                   search (false: its min / max; impl/quant/pack.py)
IMPL_MALLOC_KEEP               bool    true        on CPU, glibc keeps the memory a forward frees for the next one (no page
                                                   fault per 4 KB every forward; impl/engine/allocator.py)
IMPL_QUANT_KEEP                names   (none)      with quantized weights, linear layers kept in the checkpoint's dtype:
                                                   comma-separated module-name patterns (fnmatch, e.g.
                                                   ``per_layer_model_projection,layers.*.per_layer_*``)
=============================  ======  ==========  ==========================================================

Variables of other programs that the engine reads (declared here too, with their owners' meaning):
``TRITON_INTERPRET`` (Triton's interpreter; ``impl/kernels/triton_env.py`` sets it on a machine without CUDA),
``ONEDNN_MAX_CPU_ISA`` (oneDNN's instruction-set cap, e.g. AVX2), ``TORCH_EXTENSIONS_DIR`` (torch's extension
build folder), ``SGLANG_TORCH_PROFILER_DIR`` (SGLang's: where ``/start_profile`` traces go, default ``/tmp``; a
request's ``output_dir`` must lie inside it, ``impl/server/profile_api.py``). A ``--dp-size`` replica is started with ``OMP_NUM_THREADS`` (its share of the cores) and, on
CUDA, ``CUDA_VISIBLE_DEVICES`` (its GPU).

This module imports nothing from ``impl``: ``impl/__init__.py`` reads ``TRITON_INTERPRET`` through it before
torch loads triton.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "y", "on")
_FALSE = ("0", "false", "no", "n", "off")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable. ``parse`` takes the stripped, non-empty value and returns the typed value or
    raises ValueError; ``accepted`` says in words what it takes (for the error)."""

    name: str
    default: T
    parse: Callable[[str], T]
    accepted: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError:
            raise ValueError(f"environment variable {self.name}={raw!r} is not {self.accepted}; "
                             f"unset it for the default ({self.shown_default})") from None

    def is_set(self) -> bool:
        return self.name in os.environ

    @property
    def shown_default(self) -> str:
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return "unset" if self.default is None else str(self.default)


def _bool(text: str) -> bool:
    value = text.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(text)


def env_bool(name: str, default: bool) -> EnvVar[bool]:
    return EnvVar(name, default, _bool, f"a boolean ({' '.join(_TRUE)} or {' '.join(_FALSE)})")


def _triton_bool(text: str) -> bool:
    # Triton's own reading (getBoolEnv: on, true, 1); the values it reads as false, and only those, are false here
    value = text.lower()
    if value in ("1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    raise ValueError(text)


def env_choice(name: str, choices: tuple[str, ...], default: str) -> EnvVar[str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(text)
        return text.lower()

    return EnvVar(name, default, parse, f"one of {', '.join(choices)}")


def env_float(name: str, default: float, low: float = 0.0) -> EnvVar[float]:
    def parse(text: str) -> float:
        value = float(text)
        if not value > low or value == float("inf"):
            raise ValueError(text)
        return value

    return EnvVar(name, default, parse, f"a finite number of seconds above {low:g}")


def env_int(name: str, default: int, minimum: int = 0) -> EnvVar[int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value

    return EnvVar(name, default, parse, f"an integer >= {minimum}")


def env_str(name: str, default: str | None = None, pattern: str | None = None, accepted: str = "a string"):
    def parse(text: str) -> str:
        if pattern is not None and re.fullmatch(pattern, text) is None:
            raise ValueError(text)
        return text

    return EnvVar(name, default, parse, accepted)


# The kernel providers of the triton attention backend (impl/attention/triton_providers.py).
TRITON_KERNEL_PROVIDERS = ("auto", "triton", "cpu", "interpreter", "reference")
# The matmul routes of the fused CPU layers (impl/kernels/cpu_fused/linear.py).
CPU_LINEAR_MODES = ("auto", "packed", "onednn", "mkl")


class envs:
    """Every environment variable, by name (the table in the module docstring says what each does)."""

    # ---- YOCO_: the project's own switches and the launchers' settings
    YOCO_DISABLE_LAZY_COMPACTION = env_bool("YOCO_DISABLE_LAZY_COMPACTION", False)
    YOCO_CACHE_DIR = env_str("YOCO_CACHE_DIR", None, accepted="a folder path")
    YOCO_SERVER_START_TIMEOUT = env_float("YOCO_SERVER_START_TIMEOUT", 300.0)
    YOCO_DP_READY_TIMEOUT = env_float("YOCO_DP_READY_TIMEOUT", 600.0)
    YOCO_RESPONSES_STORE_MB = env_int("YOCO_RESPONSES_STORE_MB", 256)
    YOCO_RESPONSES_BACKGROUND_MAX = env_int("YOCO_RESPONSES_BACKGROUND_MAX", 256)
    # Tokens that leave a request's sliding window between two frees of their sliding-window slots (the hybrid
    # pool without the radix cache, impl/engine/kv_lifecycle.py); the request-cap sizing reserves them
    # (impl/cache/swa_request_cap.py). SGLang's name: SGLANG_SWA_EVICTION_INTERVAL (default 128).
    YOCO_SWA_EVICTION_INTERVAL = env_int("YOCO_SWA_EVICTION_INTERVAL", 128, minimum=1)
    # ---- IMPL_: this implementation's kernels and weight loading
    IMPL_TRITON_KERNELS = env_choice("IMPL_TRITON_KERNELS", TRITON_KERNEL_PROVIDERS, "auto")
    IMPL_CPU_ATTN = env_bool("IMPL_CPU_ATTN", True)
    IMPL_CPU_FUSED = env_bool("IMPL_CPU_FUSED", True)
    IMPL_CPU_LINEAR = env_choice("IMPL_CPU_LINEAR", CPU_LINEAR_MODES, "auto")
    IMPL_CPU_AMX = env_bool("IMPL_CPU_AMX", True)
    IMPL_CPU_PACKED_DOTS = env_bool("IMPL_CPU_PACKED_DOTS", True)
    IMPL_QUANT_BF16_DOT = env_bool("IMPL_QUANT_BF16_DOT", True)
    IMPL_CPU_ATTN_BF16 = env_bool("IMPL_CPU_ATTN_BF16", True)  # read by attention.cpp (pair_isa)
    IMPL_CPU_ATTN_KEEP_MB = env_int("IMPL_CPU_ATTN_KEEP_MB", 512)  # read by attention.cpp (kept_budget)
    IMPL_CPU_MARCH = env_str("IMPL_CPU_MARCH", "native", r"[A-Za-z0-9][A-Za-z0-9_.-]*",
                             "a gcc -march name (e.g. native, haswell)")
    IMPL_CPU_AMX_EMULATE = env_bool("IMPL_CPU_AMX_EMULATE", False)  # read by cpp_build (-DIMPL_AMX_EMULATE)
    IMPL_MMAP_EMBEDDINGS = env_bool("IMPL_MMAP_EMBEDDINGS", True)
    IMPL_QUANT_LM_HEAD = env_bool("IMPL_QUANT_LM_HEAD", True)
    IMPL_QUANT_INT4_SEARCH = env_bool("IMPL_QUANT_INT4_SEARCH", True)
    IMPL_MALLOC_KEEP = env_bool("IMPL_MALLOC_KEEP", True)
    IMPL_QUANT_KEEP = env_str("IMPL_QUANT_KEEP", "", r"[A-Za-z0-9_.*?\[\]]*(,[A-Za-z0-9_.*?\[\]]+)*",
                              "comma-separated module-name patterns (e.g. per_layer_model_projection,layers.*.self_attn.*)")
    # ---- other programs' variables, read with their owners' meaning
    TRITON_INTERPRET = EnvVar("TRITON_INTERPRET", False, _triton_bool, "a boolean as Triton reads it (1 true on or 0 false off)")
    ONEDNN_MAX_CPU_ISA = env_str("ONEDNN_MAX_CPU_ISA", "", accepted="a oneDNN ISA name (e.g. AVX2)")
    TORCH_EXTENSIONS_DIR = env_str("TORCH_EXTENSIONS_DIR", None, accepted="a folder path")
    SGLANG_TORCH_PROFILER_DIR = env_str("SGLANG_TORCH_PROFILER_DIR", "/tmp", accepted="a folder path")


def declared() -> dict[str, EnvVar]:
    """Every declared variable by name."""
    return {v.name: v for v in vars(envs).values() if isinstance(v, EnvVar)}
