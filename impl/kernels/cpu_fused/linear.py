"""Which library multiplies the fused layers' weights on CPU, per model: oneDNN (prepacked or plain), ATen's
mm, or for bf16 weights the extension's own kernels (``linear.cpp``).

Why, float32: ATen's ``mm`` on CPU is MKL's sgemm, which keeps to its AVX2 code off Intel CPUs; oneDNN
(``mkldnn::_linear_pointwise``, what vLLM's CPU build and Inductor use) dispatches on the CPU's own ISA
and runs the layer shapes 2-4x faster on an AVX-512 AMD core, and no slower under AVX2
(``bench/bench_cpu_linear.py``; table in docs/benchmarks.md). Its fixed cost per call (~10 us) loses on tiny weights, so weights
under ``MIN_WEIGHT_ELEMS`` stay on ``mm`` (the tiny test checkpoints: hidden 64).

Why, bfloat16: a bf16 matmul of ATen on a CPU without native bf16 arithmetic runs at ~0.3 GFLOP/s (an
AVX2-only Zen 3), so bf16 weights never reach one. Where the CPU has native bf16 (``avx512_bf16``, AMX;
``native_bf16()``), oneDNN's bf16 matmul runs them at about 2x its float32 rate. Elsewhere the
extension multiplies them in float32: its row kernel for decode-size batches (up to
``BF16_ROW_KERNEL_MAX_ROWS`` rows: bound by the bytes of weights read, half a float32 weight's), and
blocks of weights widened to float32 for ATen's mm above. bf16 weights under ``MIN_WEIGHT_ELEMS`` take
the row kernel at every row count (so the tiny checkpoints' rows do not depend on their batch).

Modes (``IMPL_CPU_LINEAR``; default ``auto``):

* ``packed``: weights reordered once into oneDNN's blocked layout (an opaque ``mkldnn`` tensor that
  replaces the model's plain parameter: no second copy); bf16 ones on a CPU with native bf16 read in place by the
  extension's bf16 dot products up to ``BF16_ROW_KERNEL_MAX_ROWS`` rows (``packed_dots``: packed_dot.cpp, where the
  build has them and the packed layout is one they read; not under --enable-deterministic-inference or
  ``IMPL_CPU_PACKED_DOTS=0``), oneDNN above;
* ``onednn``: oneDNN on the plain weights (reordered per call: ~20-30% slower than packed, for float32;
  bf16 weights take the extension's kernels up to ``BF16_ROW_KERNEL_MAX_ROWS`` rows: bf16 dot products in an
  AVX-512 BF16 build, else the float32-arithmetic row kernel);
* ``mkl``: ATen's ``mm`` for float32 (the model file's own numerics); for bf16 the extension's float32
  arithmetic (row kernel, widened blocks for mm);
* ``auto``: float32: ``packed``; bf16: ``packed`` with native bf16 (AVX-512 BF16 or AMX), else ``mkl``; ``mkl`` when
  torch has no oneDNN. A layer whose projections (q/k/v, o, MLP) are under ``MIN_WEIGHT_ELEMS`` keeps ``mkl``;
  in a packed layer, the per-layer-input gate and projection under it stay plain (ATen's mm) on their own.

Why bf16 prepacked with the dot products, on both kinds of native bf16: prefill runs oneDNN's matmul on weights it
does not reorder per call (plain weights cost a 1024-token prompt 9-20% on Zen 4), and decode reads the same bytes at
the memory's rate (oneDNN's prepacked matmul read them at 15-20 GB/s for 1 to 8 rows there, the dot products at
27-31); one copy of each weight serves both.

oneDNN's float32 results differ from MKL's in rounding (summation order), not in precision; its bf16
matmul rounds its input rows to bf16 (as a bf16 model does), the float32 paths do not.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

import torch

from impl.envs import CPU_LINEAR_MODES, envs

ENV = envs.IMPL_CPU_LINEAR.name
MODES = CPU_LINEAR_MODES
MIN_WEIGHT_ELEMS = 1 << 16  # 256 x 256: below this a call's fixed cost outweighs the arithmetic (linear.cpp: kSmallWeightElems)
PACK_BATCH_HINT = 64  # rows oneDNN tunes the packed layout for (any row count still runs)
BF16_ROW_KERNEL_MAX_ROWS = 16  # linear.h: kBf16RowKernelMaxRows
# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) from the first with native bf16 arithmetic upwards
_BF16_ISAS = ("AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
              "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL")


@dataclass(frozen=True)
class LinearPlan:
    mode: str  # "packed" | "onednn" | "mkl" | "quant"
    reason: str
    dtype: str = "float32"  # the weights' dtype
    packed_dots: bool = False  # packed bf16: decode-size rows in bf16 dot products on the packed layout

    def describe(self) -> str:
        if self.mode == "quant":
            return f"quantized weights through quant_linear.cpp ({self.reason})"
        if self.dtype == "bfloat16":
            rows = f"up to {BF16_ROW_KERNEL_MAX_ROWS} rows"
            row_kernel = "bf16 dot products" if bf16_dots_here() else "the row kernel (float32 arithmetic)"
            what = {
                "packed": ("bf16 weights prepacked for oneDNN's bf16 matmul"
                           + (f", read in place by bf16 dot products {rows}" if self.packed_dots else "")),
                "onednn": f"bf16 weights in place: {row_kernel} {rows}, oneDNN's bf16 matmul above",
                "mkl": f"bf16 weights in float32 arithmetic: the row kernel {rows}, float32 blocks for ATen mm above",
            }[self.mode]
        else:
            what = {"packed": "oneDNN, prepacked weights", "onednn": "oneDNN, plain weights", "mkl": "ATen mm"}[self.mode]
        return f"{what} ({self.reason})"

    def info(self) -> dict[str, str | bool]:
        return {"mode": self.mode, "reason": self.reason, "dtype": self.dtype, "packed_dots": self.packed_dots}


def requested_mode() -> str:
    return envs.IMPL_CPU_LINEAR.get()


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())


def bf16_isa() -> str:
    """The CPU's native bf16 instructions as oneDNN may use them ("" when none): ``avx512_bf16`` or ``amx_bf16``
    from the CPU, unless ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below them (e.g. ``AVX2``)."""
    cap = envs.ONEDNN_MAX_CPU_ISA.get().upper()
    if cap and cap not in _BF16_ISAS:
        return ""
    cpu = getattr(torch, "cpu", None)
    if cpu is not None and getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "amx_bf16"
    if cpu is not None and getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "avx512_bf16"
    return ""


def onednn_bf16_available() -> bool:
    """True when torch's oneDNN ops take bf16 at all (native or emulated on AVX-512; never under AVX2)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return onednn_available() and bool(probe is not None and probe())


def native_bf16() -> bool:
    """True when oneDNN runs bf16 matmuls in the CPU's own bf16 instructions."""
    return onednn_available() and bool(bf16_isa())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def bf16_dots_here() -> bool:
    """True when the extension multiplies bf16 weights by up to 16 rows in bf16 dot products (an AVX-512 BF16
    build: linear.cpp's bf16_dot_rows)."""
    from impl.kernels import cpu_fused

    ext = cpu_fused.load()
    return ext is not None and bool(ext.bf16_dot_rows_here())


def packed_dots(isa: str, batch_invariant: bool) -> bool:
    """True when prepacked bf16 weights take the bf16 dot products up to 16 rows: a CPU with native bf16 (``isa``),
    a build with the kernel, not batch-invariant (oneDNN's rows do not depend on the batch, the switch at 16 rows
    would), and IMPL_CPU_PACKED_DOTS not off. Each weight shape still needs its packed layout to match
    (packed_dot.cpp's check in ``pack``): one that does not keeps oneDNN at every row count."""
    return bool(isa) and not batch_invariant and envs.IMPL_CPU_PACKED_DOTS.get() and bf16_dots_here()


def plan(dtype: torch.dtype = torch.float32, batch_invariant: bool = False) -> LinearPlan:
    """The mode for a model whose fused layers' weights are ``dtype`` (float32 or bfloat16); ``batch_invariant``
    (--enable-deterministic-inference): bf16's auto mode is the prepacked one, whose rows do not depend on the
    batch (impl/engine/deterministic.py)."""
    name = _dtype_name(dtype)
    mode = requested_mode()
    if mode == "mkl":
        return LinearPlan("mkl", f"{ENV}=mkl", name)
    if not onednn_available():
        return LinearPlan("mkl", "torch was built without oneDNN", name)
    if dtype == torch.bfloat16:
        isa = bf16_isa()
        if mode != "auto":
            if not onednn_bf16_available():
                raise ValueError(f"{ENV}={mode} sends bf16 weights to oneDNN, which has no bf16 path on this CPU "
                                 "(it needs avx512bw/vl/dq or avx_ne_convert; ONEDNN_MAX_CPU_ISA may cap it); unset it "
                                 f"(auto) or set {ENV}=mkl for the float32-arithmetic kernels.")
            note = f"native bf16: {isa}" if isa else "no native bf16: oneDNN emulates it, slowly"
            return LinearPlan(mode, f"{ENV}={mode}; {note}", name, mode == "packed" and packed_dots(isa, batch_invariant))
        if isa:
            invariant = ", batch-invariant" if batch_invariant else ""
            return LinearPlan("packed", f"auto: native bf16 ({isa}){invariant}", name, packed_dots(isa, batch_invariant))
        cap = envs.ONEDNN_MAX_CPU_ISA.get()
        why = f"ONEDNN_MAX_CPU_ISA={cap}" if cap else "the CPU has no avx512_bf16 / AMX"
        return LinearPlan("mkl", f"auto: no native bf16 ({why})", name)
    if mode != "auto":
        return LinearPlan(mode, f"{ENV}={mode}", name)
    return LinearPlan("packed", "auto", name)


def quant_bf16_dot(model_dtype: torch.dtype) -> bool:
    """True when W8A16 / W4A16 prefill takes bf16 dot products in a model of ``model_dtype``: a bf16 model (its
    GEMMs' inputs are bf16 values, as oneDNN's bf16 matmul rounds them for bf16 weights) on a CPU whose kernels
    have them (AMX-bf16 tiles, else AVX-512 BF16: ``quant_w16_prefill_isa``), unless IMPL_QUANT_BF16_DOT=0."""
    from impl.kernels import cpu_fused

    ext = cpu_fused.load()
    return (model_dtype == torch.bfloat16 and ext is not None and bool(ext.quant_w16_prefill_isa())
            and envs.IMPL_QUANT_BF16_DOT.get())


def quant_plan(fmt_name: str, bf16_dot: bool = False) -> LinearPlan:
    """The plan of quantized fused layers (``fmt_name``: impl/quant/base.py ``WeightFormat.name()``); W8A8 and W4A8
    name the kernel their prefill runs on (AMX-int8 tiles from 32 rows where the CPU has them, W4A8 for groups of 128
    and 256; AVX-512 VNNI without AMX, W4A8 on weights in tile order; else the SIMD row kernel) and whether the
    weights are kept in tile order (W4A8 also with AVX-512 VNNI and in the AVX2 build); W8A16 / W4A16 name theirs
    (``bf16_dot``: ``quant_bf16_dot``)."""
    from impl.kernels import cpu_fused

    ext = cpu_fused.load()
    isa = ext.quant_w8a8_prefill_isa() if ext is not None else ""
    amx = isa == "amx_int8"
    if ext is not None and fmt_name.startswith(("w8a16", "w4a16")):
        dots = "AMX-bf16 tiles" if ext.quant_w16_prefill_isa() == "amx_bf16" else "AVX-512 BF16"
        decode = "decode too" if fmt_name.startswith("w4a16") else "decode from 4 rows"  # quant_linear.cpp's wo_dot_rows
        fmt_name += (f", prefill in bf16 dot products on {dots}, {decode} (inputs rounded to bf16)" if bf16_dot else
                     ", prefill dequantized to float32 for ATen's mm")
    elif ext is not None and fmt_name.startswith("w8a8"):
        fmt_name += (", prefill on AMX-int8 tiles (weights kept in tile order)" if amx else
                     ", prefill on AVX-512 VNNI (weights packed per call)" if isa == "avx512_vnni" else ", prefill on SIMD")
    elif ext is not None and fmt_name.startswith("w4a8"):
        group = re.search(r"groups of (\d+)", fmt_name)
        size = int(group.group(1)) if group else 0
        tiled = size % 64 == 0 and size and ext.w4a8_tile_order_here()
        fmt_name += (", prefill on AMX-int8 tiles" if amx and size % 128 == 0 and size else
                     ", prefill on AVX-512 VNNI" if tiled and isa == "avx512_vnni" else ", prefill on SIMD")
        if tiled:
            fmt_name += " (weights kept in tile order)"
    return LinearPlan("quant", fmt_name, "quantized")


def small_weights_plan(dtype: torch.dtype = torch.float32) -> LinearPlan:
    """The plan when every fused layer's weights are under oneDNN's size floor."""
    return LinearPlan("mkl", "weights too small for oneDNN", _dtype_name(dtype))


def sized_for_onednn(*weights: torch.Tensor) -> bool:
    """True when every weight is large enough for oneDNN (its fixed cost per call is amortised)."""
    return all(w.numel() >= MIN_WEIGHT_ELEMS for w in weights)


def pack(w: torch.Tensor, dots: bool = False) -> torch.Tensor:
    """``w`` [out, in] (float32 or bf16) reordered for oneDNN's linear (an opaque ``mkldnn`` tensor, same sizes).
    ``dots`` (a plan's ``packed_dots``): a bf16 weight's packed copy is compared with ``w`` for the layouts the bf16
    dot products read (packed_dot.cpp), which then take its decode-size rows."""
    w = w.contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT)
    if dots and w.dtype == torch.bfloat16:
        from impl.kernels import cpu_fused

        ext = cpu_fused.load()
        if ext is not None:
            ext.packed_dot_layout(w, packed)
    return packed
