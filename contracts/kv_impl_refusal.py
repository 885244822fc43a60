"""This engine's honest behaviour at launch: valid settings whose feature it lacks stop it with ONE ValueError
listing every such flag (issue 3, item 5). Specific to this engine: SGLang implements these features."""

from __future__ import annotations

from contracts.base import contract, require
from contracts.expect import norm
from contracts.models import DSV3, E2B, PREFILL_ONLY_OK, argv_for

SEED = "seeds/004"

# (flags, platform, flags the refusal must name). Every case passes validation (check) first.
SINGLE = [
    (("--disaggregation-mode", "decode"), "cpu", ("--disaggregation-mode",)),
    (("--disaggregation-transfer-backend", "nixl"), "cpu", ("--disaggregation-transfer-backend",)),
    (("--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "host_pool"), "cpu",
     ("--disaggregation-mode", "--disaggregation-decode-retraction-backup")),
    (("--enable-hierarchical-cache",), "cpu", ("--enable-hierarchical-cache",)),
    (("--hicache-storage-backend", "file"), "cpu", ("--hicache-storage-backend",)),
    (("--enable-lmcache",), "cpu", ("--enable-lmcache",)),
    (("--enable-unified-memory", "--attention-backend", "triton"), "cpu", ("--enable-unified-memory", "--enable-page-major-kv-layout")),
    (("--enable-hisparse",), "cpu", ("--enable-hisparse",)),
    (("--attn-cp-size", "2"), "cpu", ("--attn-cp-size",)),
    (("--enable-prefill-cp",), "cpu", ("--enable-prefill-cp",)),
    (("--dcp-size", "2"), "cpu", ("--dcp-size",)),
    (("--pp-size", "2"), "cpu", ("--pp-size",)),
    (("--tp-size", "4"), "cpu", ("--tp-size",)),
    (("--attention-backend", "fa3"), "hopper", ("--attention-backend", "fa3")),
    (("--decode-attention-backend", "flashinfer"), "hopper", ("--decode-attention-backend", "flashinfer")),
    (("--linear-attn-backend", "triton"), "cpu", ("--linear-attn-backend",)),
    (("--mamba-backend", "triton"), "cpu", ("--mamba-backend",)),
    (("--kv-cache-dtype", "nvfp4", "--attention-backend", "triton"), "sm100", ("--kv-cache-dtype", "nvfp4")),
    (("--kv-cache-dtype", "fp4_mx_block16", "--attention-backend", "triton"), "hopper", ("--kv-cache-dtype", "fp4_mx_block16")),
    (("--kv-cache-dtype", "mxfp8"), "sm120", ("--kv-cache-dtype", "mxfp8")),
    (PREFILL_ONLY_OK, "hopper", ("--prefill-only-disable-kv-cache", "--is-embedding", "--attention-backend")),
    (("--is-embedding",), "cpu", ("--is-embedding",)),
    (("--speculative-algorithm", "EAGLE"), "cpu", ("--speculative-algorithm",)),
    (("--speculative-algorithm", "DSPARK", "--speculative-num-steps", "3"), "cpu", ("--speculative-algorithm", "--speculative-num-steps")),
    (("--enable-priority-scheduling",), "cpu", ("--enable-priority-scheduling",)),
    (("--cuda-graph-backend-prefill", "full"), "hopper", ("--cuda-graph-backend-prefill",)),
]

ACCEPTED = [
    ((), "cpu", E2B),
    (("--attention-backend", "triton"), "hopper", E2B),
    (("--attention-backend", "torch_native"), "cpu", E2B),
    (("--kv-cache-dtype", "bf16"), "cpu", E2B),
    (("--kv-cache-dtype", "fp8_e4m3"), "cpu", E2B),
    (("--kv-cache-dtype", "fp8_e5m2"), "cpu", E2B),
    (("--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "triton"), "hopper", E2B),
    (("--kv-cache-dtype", "bfloat16", "--attention-backend", "triton"), "sm100", E2B),
    (("--kv-cache-dtype", "auto", "--disable-radix-cache", "--swa-full-tokens-ratio", "0.5"), "cpu", E2B),
    (("--cuda-graph-backend-prefill", "disabled", "--disable-cuda-graph"), "hopper", E2B),
]

COMBINED = (
    ("--enable-lmcache", "--dcp-size", "2", "--enable-hisparse", "--enable-priority-scheduling", "--tp-size", "2"),
    ("--enable-lmcache", "--dcp-size", "--enable-hisparse", "--enable-priority-scheduling", "--tp-size"),
)


@contract(
    "IMPL-REFUSES-UNIMPLEMENTED", f"{SEED} (engine scope: issue 3, honest behaviour)", rules=("K1", "K2", "K19", "K26", "K33", "K40"),
    note="Engine-specific: the rule ids are the seed-004 settings families it refuses. fp8_e4m3 / fp8_e5m2 KV "
    "caches start since issue 25 (contracts KV-FP8-*); FP4 and MXFP8 stay refused.",
)
def impl_refuses_unimplemented(subject) -> None:
    """At launch, after validation, settings whose feature this engine does not implement (PD disaggregation,
    hierarchical cache, LMCache, unified memory, page-major layout, HiSparse, context parallelism, DCP, TP/PP > 1,
    non-triton/torch_native, linear-attention and Mamba backends, FP4/MXFP8 KV, prefill-only embedding,
    speculative decoding other than FROZEN_KV_MTP, priority scheduling, prefill cuda-graph capture) stop it with
    ONE ValueError naming every such flag; auto / bf16 / bfloat16 / fp8_e4m3 / fp8_e5m2 KV and the implemented
    backends start."""
    for flags, platform, model in ACCEPTED:
        err = subject.refuse(argv_for(model, *flags), platform)
        require(err is None, f"{list(flags)} on {platform} is implemented and must start; refused with {err}")
    for flags, platform, mentions in SINGLE:
        out = subject.check(argv_for(E2B, *flags), platform)
        require(out.error is None, f"{list(flags)} on {platform} must pass validation first; check raised {out.error}")
        err = subject.refuse(argv_for(E2B, *flags), platform)
        require(isinstance(err, ValueError), f"{list(flags)} on {platform}: expected a ValueError at launch, got {err!r}")
        missing = [m for m in mentions if norm(m) not in norm(str(err))]
        require(not missing, f"{list(flags)}: the refusal must name {missing}; it said {str(err)!r}")
    flags, mentions = COMBINED
    err = subject.refuse(argv_for(E2B, *flags), "cpu")
    require(isinstance(err, ValueError), f"{list(flags)}: expected ONE ValueError listing every flag, got {err!r}")
    missing = [m for m in mentions if norm(m) not in norm(str(err))]
    require(not missing, f"{list(flags)}: the single refusal must list every flag; missing {missing} in {str(err)!r}")
    # Validation comes first: an invalid combination is reported as such.
    err = subject.refuse(argv_for(DSV3, "--enable-page-major-kv-layout"), "cpu")
    require(err is not None and "--enable-unified-memory" in str(err), f"page-major alone must fail validation first; got {err!r}")
