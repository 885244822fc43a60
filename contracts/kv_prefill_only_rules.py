"""Seed 004: --prefill-only-disable-kv-cache, its preconditions (K40-K47) and its backend (K9, K10)."""

from __future__ import annotations

from contracts.base import contract
from contracts.expect import VALUE_TYPES, must_accept, must_reject
from contracts.models import LLAMA, PREFILL_ONLY_OK

# The options of seed 004's hook these rules are about (contracts.base.Contract.options): an engine without
# them is out of scope for these rules.
OPTIONS = (
    "--attention-backend",
    "--attn-cp-size",
    "--chunked-prefill-size",
    "--cp-strategy",
    "--decode-attention-backend",
    "--disable-radix-cache",
    "--enable-hisparse",
    "--enable-prefill-cp",
    "--is-embedding",
    "--kv-cache-dtype",
    "--prefill-attention-backend",
    "--prefill-only-disable-kv-cache",
    "--tp-size",
)

SEED = "seeds/004"

FLAG = "--prefill-only-disable-kv-cache"
ARGS_FN = f"{SEED} validate_prefill_only_disable_kv_cache_args"


def _without(flags: tuple[str, ...], *drop: str) -> tuple[str, ...]:
    """``flags`` minus each option in ``drop`` (and its value when it takes one)."""
    out: list[str] = []
    skip = False
    for i, f in enumerate(flags):
        if skip:
            skip = False
            continue
        if f in drop:
            skip = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        out.append(f)
    return tuple(out)


@contract(
    "PREFILL-ONLY-AFTER-BACKEND-RESOLUTION", f"{SEED} handle_prefill_only_disable_kv_cache", rules=("K9",), options=OPTIONS,
    rule=f"{FLAG}'s backend rule sees the resolved attention backend: with no backend given, the platform default "
    "(triton on CUDA, torch_native on CPU for a plain model) is what is checked and named; a role backend alone is enough.",
    note="The seed asserts (AssertionError) that the resolved backend is not None, an internal ordering guard; "
    "ours raises RuntimeError. This contract observes the ordering through the resolved backend the rule names.",
)
def prefill_only_after_backend_resolution(subject) -> None:
    unset = _without(PREFILL_ONLY_OK, "--attention-backend")
    must_reject(subject, unset, (FLAG, "'triton'"), platform="hopper", types=VALUE_TYPES)
    # A model whose CPU default is torch_native (Gemma-4 resolves an unset backend to triton on every platform here).
    must_reject(subject, unset, (FLAG, "'torch_native'"), platform="cpu", model=LLAMA, types=VALUE_TYPES)
    must_accept(subject, (*unset, "--prefill-attention-backend", "fa4"), platform="hopper")
    must_accept(subject, (*unset, "--prefill-attention-backend", "fa4"), platform="cpu")


@contract(
    "PREFILL-ONLY-FA-BACKEND", f"{SEED} handle_prefill_only_disable_kv_cache", rules=("K10",), options=OPTIONS,
    rule=f"{FLAG} needs the fa3 or fa4 prefill backend: any other prefill backend is a ValueError naming it.",
)
def prefill_only_fa_backend(subject) -> None:
    # A plain MHA model (Llama), which every backend here serves: Gemma-4's own backend list would refuse some first.
    base = _without(PREFILL_ONLY_OK, "--attention-backend")
    for flags in (("--attention-backend", "fa3"), ("--attention-backend", "fa4"),
                  ("--prefill-attention-backend", "fa4", "--decode-attention-backend", "triton")):
        must_accept(subject, (*base, *flags), platform="hopper", model=LLAMA)
    for backend in ("triton", "flashinfer", "torch_native", "trtllm_mha"):
        must_reject(subject, (*base, "--attention-backend", backend), (FLAG, backend, "fa3", "fa4"), platform="hopper",
                    types=VALUE_TYPES, model=LLAMA)
    must_reject(
        subject, (*base, "--prefill-attention-backend", "triton", "--decode-attention-backend", "fa3"),
        (FLAG, "triton"), platform="hopper", types=VALUE_TYPES, model=LLAMA,
    )


def _precondition(subject, bad: tuple[str, ...], mentions: tuple[str, ...], platform: str = "hopper",
                  good: tuple[str, ...] | None = None, alone: tuple[str, ...] | None = None) -> None:
    """The baseline is accepted; ``bad`` is rejected naming ``mentions``; ``good`` is accepted; without
    the flag, ``alone`` (the offending setting by itself) is accepted."""
    must_accept(subject, PREFILL_ONLY_OK, platform=platform)
    must_reject(subject, bad, (FLAG, *mentions), platform=platform, types=VALUE_TYPES)
    if good is not None:
        must_accept(subject, good, platform=platform)
    if alone is not None:
        must_accept(subject, alone, platform=platform)


@contract(
    "PREFILL-ONLY-NEEDS-EMBEDDING", ARGS_FN, rules=("K40",), options=OPTIONS,
    rule=f"{FLAG} without --is-embedding is a ValueError.",
    note="Hook order: SGLang 0.5.23 runs validate_prefill_only_disable_kv_cache_args early, before the attention "
    "backends resolve; it reads only user settings (and attn_cp_size, which nothing resolves here), so we run it "
    "first among the KV-cache hooks, after the backend default. K40-K47 are otherwise unchanged in 0.5.23.",
)
def prefill_only_needs_embedding(subject) -> None:
    _precondition(subject, _without(PREFILL_ONLY_OK, "--is-embedding"), ("--is-embedding",))


@contract(
    "PREFILL-ONLY-NO-FP4-KV", ARGS_FN, rules=("K41",), options=OPTIONS,
    rule=f"{FLAG} with --kv-cache-dtype nvfp4 or fp4_mx_block16 is a ValueError.",
)
def prefill_only_no_fp4(subject) -> None:
    for dtype in ("nvfp4", "fp4_mx_block16"):
        _precondition(
            subject, (*PREFILL_ONLY_OK, "--kv-cache-dtype", dtype), ("--kv-cache-dtype", dtype), platform="sm100",
            good=(*PREFILL_ONLY_OK, "--kv-cache-dtype", "bf16"),
        )


@contract(
    "PREFILL-ONLY-NO-MXFP8-KV", ARGS_FN, rules=("K42",), options=OPTIONS,
    rule=f"{FLAG} with --kv-cache-dtype mxfp8 is a ValueError.",
)
def prefill_only_no_mxfp8(subject) -> None:
    _precondition(
        subject, (*PREFILL_ONLY_OK, "--kv-cache-dtype", "mxfp8"), ("--kv-cache-dtype", "mxfp8"),
        platform="sm120", alone=("--kv-cache-dtype", "mxfp8"),
    )


@contract(
    "PREFILL-ONLY-NO-CHUNKING", ARGS_FN, rules=("K43",), options=OPTIONS,
    rule=f"{FLAG} needs --chunked-prefill-size -1 (unset or any other size is a ValueError).",
)
def prefill_only_no_chunking(subject) -> None:
    unset = _without(PREFILL_ONLY_OK, "--chunked-prefill-size")
    _precondition(subject, unset, ("--chunked-prefill-size", "-1"))
    _precondition(subject, (*unset, "--chunked-prefill-size", "8192"), ("--chunked-prefill-size", "-1"))


@contract(
    "PREFILL-ONLY-NO-RADIX-CACHE", ARGS_FN, rules=("K44",), options=OPTIONS, rule=f"{FLAG} needs --disable-radix-cache.",
)
def prefill_only_no_radix(subject) -> None:
    _precondition(
        subject, _without(PREFILL_ONLY_OK, "--disable-radix-cache"), ("--disable-radix-cache",)
    )


@contract(
    "PREFILL-ONLY-NO-ATTN-CP", ARGS_FN, rules=("K45",), options=OPTIONS,
    rule=f"{FLAG} with a resolved --attn-cp-size > 1 is a ValueError; --attn-cp-size 1 is fine.",
)
def prefill_only_no_attn_cp(subject) -> None:
    for size in ("2", "4"):  # attention CP shards within tensor parallelism: --tp-size a multiple of it
        _precondition(subject, (*PREFILL_ONLY_OK, "--tp-size", size, "--attn-cp-size", size), ("--attn-cp-size",),
                      good=(*PREFILL_ONLY_OK, "--attn-cp-size", "1"), alone=("--tp-size", size, "--attn-cp-size", size))


@contract(
    "PREFILL-ONLY-NO-PREFILL-CP", ARGS_FN, rules=("K46",), options=OPTIONS,
    rule=f"{FLAG} with --enable-prefill-cp is a ValueError.",
)
def prefill_only_no_prefill_cp(subject) -> None:
    _precondition(subject, (*PREFILL_ONLY_OK, "--enable-prefill-cp"), ("--enable-prefill-cp",),
                  alone=("--enable-prefill-cp", "--cp-strategy", "zigzag"))


@contract(
    "PREFILL-ONLY-NO-HISPARSE", ARGS_FN, rules=("K47",), options=OPTIONS,
    rule=f"{FLAG} with --enable-hisparse is a ValueError.",
)
def prefill_only_no_hisparse(subject) -> None:
    _precondition(subject, (*PREFILL_ONLY_OK, "--enable-hisparse"), ("--enable-hisparse",),
                  alone=("--enable-hisparse",))
