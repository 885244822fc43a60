"""Seed 004: MXFP8 and FP4 (KV4) KV-cache dtypes against the platform and attention backends (K1-K8)."""

from __future__ import annotations

from contracts.base import case, contract, require
from contracts.expect import RUNTIME_TYPES, VALUE_TYPES, must_accept, must_reject, warnings_about
from contracts.models import DSV3, LLAMA

# The options of seed 004's hook these rules are about (contracts.base.Contract.options): an engine without
# them is out of scope for these rules.
OPTIONS = (
    "--attention-backend",
    "--decode-attention-backend",
    "--kv-cache-dtype",
    "--prefill-attention-backend",
)

SEED = "seeds/004"

MXFP8 = ("--kv-cache-dtype", "mxfp8")
NVFP4 = ("--kv-cache-dtype", "nvfp4")
FP4_MX = ("--kv-cache-dtype", "fp4_mx_block16")
# KV4 is either FP4 dtype: the KV4 rules (K3-K7) are checked with each, on Blackwell, where both are accepted (K2).
KV4_DTYPES = (NVFP4, FP4_MX)


@contract(
    "KV-MXFP8-BLACKWELL", f"{SEED} handle_mxfp8_kv_cache_compatibility", rules=("K1",), options=OPTIONS,
    note="Hook order: SGLang 0.5.23's pipeline runs handle_kv4_compatibility before "
    "handle_mxfp8_kv_cache_compatibility (they apply to disjoint dtypes); we run them in that order.",
)
def mxfp8_blackwell(subject) -> None:
    """--kv-cache-dtype mxfp8 is a ValueError off Blackwell (CPU, Ampere, Hopper) and accepted on SM100 / SM120."""
    for platform in ("cpu", "ampere", "hopper"):
        with case(f"mxfp8 on {platform}"):
            must_reject(subject, MXFP8, ("--kv-cache-dtype", "mxfp8", "Blackwell"), platform=platform, types=VALUE_TYPES)
    for platform in ("sm100", "sm120"):
        with case(f"mxfp8 on {platform}"):
            must_accept(subject, MXFP8, platform=platform)
    with case("fp8_e4m3 on hopper"):
        must_accept(subject, ("--kv-cache-dtype", "fp8_e4m3"), platform="hopper")


@contract(
    "KV-NVFP4-SM100-SM120", f"{SEED} handle_kv4_compatibility", rules=("K2",), options=OPTIONS,
    note="SGLang 0.5.23 adds, for FP4 KV on CUDA: a ValueError with --enable-unified-memory; SM100 native NVFP4 "
    "(trtllm_mha) rules on speculative algorithms, draft backend, PD disaggregation and hierarchical cache / LMCache; "
    "and a new hook (handle_nvfp4_prefill_kv_dequant_dtype) that resolves nvfp4's prefill/decode backends. The "
    "seed has none of these.",
)
def nvfp4_sm100_sm120(subject) -> None:
    """On CUDA, --kv-cache-dtype nvfp4 needs SM100 or SM120: elsewhere a RuntimeError that suggests fp4_mx_block16
    (which Hopper accepts)."""
    for platform in ("hopper", "ampere"):
        for backend in ("triton", "trtllm_mha"):
            with case(f"nvfp4 {backend} on {platform}"):
                must_reject(
                    subject, (*NVFP4, "--attention-backend", backend),
                    ("--kv-cache-dtype", "nvfp4", "SM100", "SM120", "fp4_mx_block16"), platform=platform, types=RUNTIME_TYPES,
                )
    for platform in ("sm100", "sm120"):
        with case(f"nvfp4 triton on {platform}"):
            must_accept(subject, (*NVFP4, "--attention-backend", "triton"), platform=platform)
    with case("fp4_mx_block16 triton on hopper"):
        must_accept(subject, (*FP4_MX, "--attention-backend", "triton"), platform="hopper")


@contract(
    "KV4-MIXED-BACKENDS-WARN", f"{SEED} handle_kv4_compatibility", rules=("K3",), options=OPTIONS,
    note="SGLang 0.5.23 suppresses this warning for its supported mixed NVFP4 recipe (flashinfer prefill + "
    "trtllm_mha decode).",
)
def kv4_mixed_backends_warn(subject) -> None:
    """KV4 (nvfp4 or fp4_mx_block16) on CUDA with prefill backend != decode backend (prefill not fa4): a WARNING
    naming both backends, and no backend allow-list is checked; matching backends give no such warning."""
    for kv4 in KV4_DTYPES:
        cases = (
            (LLAMA, "sm100", (*kv4, "--prefill-attention-backend", "flashinfer", "--decode-attention-backend", "triton"), "flashinfer", "triton"),
            (LLAMA, "sm100", (*kv4, "--prefill-attention-backend", "fa3", "--decode-attention-backend", "torch_native"), "fa3", "torch_native"),
            # MLA with backends no KV4 list allows: nothing else is checked.
            (DSV3, "sm120", (*kv4, "--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashmla"), "fa3", "flashmla"),
        )
        for model, platform, flags, prefill, decode in cases:
            with case(f"{flags} on {model} ({platform})"):
                out = must_accept(subject, flags, model=model, platform=platform)
                hits = warnings_about(out, "KV4", prefill, decode)
                require(len(hits) == 1, f"{flags} on {model}: expected one WARNING naming KV4, {prefill} and {decode}; log was {out.log}")
        for argv in ((*kv4, "--attention-backend", "triton"), (*kv4, "--prefill-attention-backend", "fa4", "--decode-attention-backend", "triton")):
            with case(f"{argv} on {LLAMA} (sm100)"):
                out = must_accept(subject, argv, platform="sm100", model=LLAMA)
                require(not warnings_about(out, "KV4"), f"{argv}: no mixed-backend KV4 warning expected; log was {out.log}")
    with case("fp4_mx_block16 fa3 + torch_native on hopper"):
        flags = (*FP4_MX, "--prefill-attention-backend", "fa3", "--decode-attention-backend", "torch_native")
        out = must_accept(subject, flags, model=LLAMA, platform="hopper")
        require(len(warnings_about(out, "KV4", "fa3", "torch_native")) == 1,
                f"{flags} on hopper: expected one WARNING naming KV4, fa3 and torch_native; log was {out.log}")


@contract(
    "KV4-FA4-MLA-DECODE", f"{SEED} handle_kv4_compatibility", rules=("K4",), options=OPTIONS,
    note="SGLang 0.5.23 drops cutlass_mla from this list (flashinfer, trtllm_mla only).",
)
def kv4_fa4_mla_decode(subject) -> None:
    """KV4 with the fa4 prefill backend on an MLA model: the decode backend must be cutlass_mla, flashinfer or
    trtllm_mla."""
    for decode in ("cutlass_mla", "flashinfer", "trtllm_mla"):
        with case(f"fa4 + {decode}"):
            must_accept(subject, (*NVFP4, "--prefill-attention-backend", "fa4", "--decode-attention-backend", decode), model=DSV3, platform="sm100")
    for decode in ("triton", "flashmla", "fa3"):
        with case(f"fa4 + {decode}"):
            must_reject(
                subject, (*NVFP4, "--prefill-attention-backend", "fa4", "--decode-attention-backend", decode),
                ("decode-attention-backend", decode, "trtllm_mla", "cutlass_mla"), model=DSV3, platform="sm100",
            )
    with case("fp4_mx_block16 fa4 on hopper"):
        must_reject(subject, (*FP4_MX, "--attention-backend", "fa4"), ("decode-attention-backend", "fa4"), model=DSV3, platform="hopper")


@contract("KV4-FA4-MHA-DECODE", f"{SEED} handle_kv4_compatibility", rules=("K5",), options=OPTIONS)
def kv4_fa4_mha_decode(subject) -> None:
    """KV4 (either FP4 dtype) with the fa4 prefill backend on an MHA model: the decode backend must be triton,
    torch_native or flex_attention."""
    for kv4 in KV4_DTYPES:
        for decode in ("triton", "torch_native", "flex_attention"):
            with case(f"{kv4[1]} fa4 + {decode}"):
                must_accept(subject, (*kv4, "--prefill-attention-backend", "fa4", "--decode-attention-backend", decode), platform="sm100", model=LLAMA)
        for decode in ("flashinfer", "trtllm_mha", "fa3"):
            with case(f"{kv4[1]} fa4 + {decode}"):
                must_reject(
                    subject, (*kv4, "--prefill-attention-backend", "fa4", "--decode-attention-backend", decode),
                    ("decode-attention-backend", decode, "flex_attention"), platform="sm100", model=LLAMA,
                )
        with case(f"{kv4[1]} fa4 alone on sm120"):
            must_reject(subject, (*kv4, "--attention-backend", "fa4"), ("decode-attention-backend", "fa4"), platform="sm120", model=LLAMA)


@contract(
    "KV4-MLA-BACKEND", f"{SEED} handle_kv4_compatibility", rules=("K6",), options=OPTIONS,
    note="SGLang 0.5.23 drops cutlass_mla from this list (flashinfer, trtllm_mla only).",
)
def kv4_mla_backend(subject) -> None:
    """KV4 on an MLA model without fa4 prefill (matching backends): --attention-backend must be cutlass_mla,
    flashinfer or trtllm_mla (the resolved default counts)."""
    for backend in ("cutlass_mla", "flashinfer", "trtllm_mla"):
        with case(backend):
            must_accept(subject, (*NVFP4, "--attention-backend", backend), model=DSV3, platform="sm100")
    for backend in ("triton", "flashmla", "fa3", "torch_native"):
        with case(backend):
            must_reject(subject, (*NVFP4, "--attention-backend", backend), ("attention-backend", backend, "trtllm_mla"), model=DSV3, platform="sm100")
    # No backend given: the CUDA default (triton) is what is checked.
    with case("no backend given"):
        must_reject(subject, NVFP4, ("attention-backend", "triton"), model=DSV3, platform="sm120")


@contract("KV4-MHA-BACKEND", f"{SEED} handle_kv4_compatibility", rules=("K7",), options=OPTIONS)
def kv4_mha_backend(subject) -> None:
    """KV4 (either FP4 dtype) on an MHA model without fa4 prefill (matching backends): --attention-backend must be
    triton, torch_native, flex_attention or trtllm_mha."""
    for kv4 in KV4_DTYPES:
        for backend in ("triton", "torch_native", "flex_attention", "trtllm_mha"):
            with case(f"{kv4[1]} {backend}"):
                must_accept(subject, (*kv4, "--attention-backend", backend), platform="sm120", model=LLAMA)
        for backend in ("flashinfer", "fa3", "flashmla"):
            with case(f"{kv4[1]} {backend}"):
                must_reject(subject, (*kv4, "--attention-backend", backend), ("attention-backend", backend, "trtllm_mha"), platform="sm120", model=LLAMA)
    with case("fp4_mx_block16 flashinfer on hopper"):
        must_reject(subject, (*FP4_MX, "--attention-backend", "flashinfer"), ("attention-backend", "flashinfer"), platform="hopper", model=LLAMA)
    with case("fp4_mx_block16, no backend, on hopper"):
        must_accept(subject, FP4_MX, platform="hopper", model=LLAMA)


@contract(
    "KV4-NON-CUDA", f"{SEED} handle_kv4_compatibility", rules=("K8",), options=OPTIONS,
    note="Our message also names --kv-cache-dtype (the seed's names no flag).",
)
def kv4_non_cuda(subject) -> None:
    """KV4 (nvfp4 / fp4_mx_block16) off CUDA is a RuntimeError 'KV4 is not tested on non-CUDA platforms', whatever
    the backend."""
    for flags in (NVFP4, FP4_MX, (*FP4_MX, "--attention-backend", "triton"), (*NVFP4, "--attention-backend", "torch_native")):
        with case(" ".join(flags)):
            must_reject(subject, flags, ("KV4 is not tested on non-CUDA platforms",), platform="cpu", types=RUNTIME_TYPES)
