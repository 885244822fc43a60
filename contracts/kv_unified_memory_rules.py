"""Seed 004 handle_unified_memory_pool and _validate_unified_memory_dcp (K19-K32)."""

from __future__ import annotations

from contracts.base import ContractViolation, contract, require, violation
from contracts.expect import ASSERT_TYPES, VALUE_TYPES, must_accept, must_reject, warnings_about
from contracts.models import DSV3, E2B, LLAMA, MLA_SWA, UM, UM_TRITON, model_dir

# The options of seed 004's hook these rules are about (contracts.base.Contract.options): an engine without
# them is out of scope for these rules.
OPTIONS = (
    "--attention-backend",
    "--cuda-graph-backend-prefill",
    "--dcp-size",
    "--decode-attention-backend",
    "--disable-cuda-graph",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--enable-hierarchical-cache",
    "--enable-hisparse",
    "--enable-lmcache",
    "--enable-unified-memory",
    "--pp-size",
    "--prefill-attention-backend",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-eagle-topk",
)

SEED = "seeds/004"
# The environment switch that disables lazy compaction (SGLang: SGLANG_DISABLE_LAZY_COMPACTION).
LAZY_COMPACTION_ENV = "YOCO_DISABLE_LAZY_COMPACTION"



def lazy_compaction_env(subject) -> str:
    """The switch's name in the subject's own environment prefix (``env_prefix``: SGLang's is ``SGLANG_``); the
    contracts set ``YOCO_...`` and an adapter maps the prefix."""
    return getattr(subject, "env_prefix", "YOCO_") + "DISABLE_LAZY_COMPACTION"


# The GPU platform of the DCP and DSPARK cases: every backend they name exists there (trtllm_mla is Blackwell-only,
# DSPARK needs a CUDA device), so only the unified-memory rule can refuse.
GPU = "sm100"

def _draft(model: str) -> tuple[str, ...]:
    """A draft model for DSPARK (SGLang 0.5.23 requires one): the target's own folder, enough for argument checks."""
    return ("--speculative-draft-model-path", model_dir(model))


FN = f"{SEED} handle_unified_memory_pool"
DCP_FN = f"{SEED} _validate_unified_memory_dcp"
UMF = "--enable-unified-memory"
PD = ("--disaggregation-mode", "decode")


@contract(
    "UM-PD-MOONCAKE", FN, rules=("K19",), options=OPTIONS,
    rule=f"{UMF} with PD disaggregation supports only the mooncake transfer backend.",
    note="SGLang 0.5.23 reads the allowed set from ServerArgs._unified_memory_pd_transfer_backends() (still "
    "{mooncake}) and also refuses mooncake with speculative decoding, plus decode-offload / host-pool sub-rules.",
)
def um_pd_mooncake(subject) -> None:
    # Not mooncake_tcp: a mooncake transport (SGLang resolves it to mooncake).
    for backend in ("nixl", "fake"):
        for mode in ("decode", "prefill") if backend != "fake" else ("decode",):  # fake: a decode-side test backend
            must_reject(
                subject, (*UM_TRITON, "--disaggregation-mode", mode, "--disaggregation-transfer-backend", backend),
                (UMF, "mooncake", backend),
            )
        must_accept(subject, (*UM_TRITON, "--disaggregation-transfer-backend", backend))
        must_accept(subject, (*PD, "--disaggregation-transfer-backend", backend))
    must_accept(subject, (*UM_TRITON, *PD, "--disaggregation-transfer-backend", "mooncake"))


@contract("UM-PD-NO-PP", FN, rules=("K20",), options=OPTIONS, rule=f"{UMF} with PD disaggregation needs --pp-size 1.")
def um_pd_no_pp(subject) -> None:
    must_reject(subject, (*UM_TRITON, *PD, "--pp-size", "2"), (UMF, "pipeline parallel"))
    must_accept(subject, (*UM_TRITON, "--pp-size", "2"))
    must_accept(subject, (*UM_TRITON, *PD, "--pp-size", "1"))


@contract(
    "UM-PD-LAZY-COMPACTION", FN, rules=("K21",), options=OPTIONS,
    rule=f"{UMF} with PD disaggregation refuses {LAZY_COMPACTION_ENV}=1 (lazy compaction is required).",
    note=f"Our environment switch is {LAZY_COMPACTION_ENV} (SGLang: SGLANG_DISABLE_LAZY_COMPACTION); a value "
    "that is not a boolean is a ValueError naming it.",
    stricter="a switch value that is not a boolean is a ValueError naming the switch",
)
def um_pd_lazy_compaction(subject) -> None:
    env_name = lazy_compaction_env(subject)
    for value in ("1", "true", "YES"):
        must_reject(subject, (*UM_TRITON, *PD), (UMF, env_name, "lazy compaction"), env={LAZY_COMPACTION_ENV: value})
    for value in ("0", "false"):
        must_accept(subject, (*UM_TRITON, *PD), env={LAZY_COMPACTION_ENV: value})
    must_accept(subject, (*UM_TRITON, *PD))
    must_accept(subject, UM_TRITON, env={LAZY_COMPACTION_ENV: "1"})
    try:
        must_reject(subject, (*UM_TRITON, *PD), (env_name,), env={LAZY_COMPACTION_ENV: "maybe"}, types=VALUE_TYPES)
    except ContractViolation as e:  # this project's stricter choice, not the seed's rule
        raise violation(str(e).split("] ", 1)[1], project=True) from e


@contract(
    "UM-PD-NO-HISPARSE", FN, rules=("K22",), options=OPTIONS,
    rule=f"{UMF} with PD disaggregation is not compatible with --enable-hisparse.",
)
def um_pd_no_hisparse(subject) -> None:
    must_reject(subject, (*UM_TRITON, *PD, "--enable-hisparse"), (UMF, "--enable-hisparse"))
    must_accept(subject, (*UM_TRITON, "--enable-hisparse"))


@contract(
    "UM-SPEC-ALGORITHM", FN, rules=("K23",), options=OPTIONS, rule=f"{UMF} allows no speculative algorithm but DSPARK.",
    note="SGLang 0.5.23 also allows EAGLE, EAGLE3 and DFLASH (with their own backend and model conditions), and "
    "adds unified-memory rules the seed lacks (two-batch overlap, external cache linker, EAGLE with host_pool or "
    "hierarchical cache).",
)
def um_spec_algorithm(subject) -> None:
    for algo in ("EAGLE", "EAGLE3", "NGRAM", "STANDALONE"):
        must_reject(subject, (*UM_TRITON, "--speculative-algorithm", algo), (UMF, "--speculative-algorithm", algo, "DSPARK"))
        must_accept(subject, ("--attention-backend", "triton", "--speculative-algorithm", algo))
    must_accept(subject, (*UM_TRITON, "--speculative-algorithm", "DSPARK", *_draft(E2B)), platform=GPU)
    must_accept(subject, UM_TRITON)


@contract(
    "UM-DSPARK-TOPK", FN, rules=("K24",), options=OPTIONS,
    rule=f"{UMF} + DSPARK needs --speculative-eagle-topk unset or 1 (a linear draft chain).",
    note="SGLang 0.5.23 checks --speculative-eagle-topk in {None, 1} for every algorithm, not only DSPARK.",
)
def um_dspark_topk(subject) -> None:
    dspark = (*UM_TRITON, "--speculative-algorithm", "DSPARK", *_draft(E2B))
    for k in ("2", "4"):
        must_reject(subject, (*dspark, "--speculative-eagle-topk", k), (UMF, "DSPARK", "--speculative-eagle-topk", k), platform=GPU)
    must_accept(subject, (*dspark, "--speculative-eagle-topk", "1"), platform=GPU)
    must_accept(subject, dspark, platform=GPU)
    must_accept(subject, (*UM_TRITON, "--speculative-eagle-topk", "4"), platform=GPU)


@contract(
    "UM-DSPARK-BACKENDS", FN, rules=("K25",), options=OPTIONS,
    rule=f"{UMF} + DSPARK needs prefill and decode backends within triton, trtllm_mla, cutedsl_mla, tokenspeed_mla.",
    note="SGLang 0.5.23 allows {triton, trtllm_mla, cutedsl_mla, flashmla, flashinfer, fa3, fa4} for DSPARK "
    "(tokenspeed_mla dropped).",
)
def um_dspark_backends(subject) -> None:
    def dspark(model: str) -> tuple[str, ...]:
        return ("--enable-unified-memory", "--speculative-algorithm", "DSPARK", *_draft(model))

    for backend in ("trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "triton"):
        must_accept(subject, (*dspark(DSV3), "--attention-backend", backend), model=DSV3, platform=GPU)
    must_accept(subject, (*dspark(E2B), "--attention-backend", "triton"), model=E2B, platform=GPU)
    # fa3 / fa4 on a plain MHA model (Llama): Gemma-4's own backend list would refuse fa3 first
    for model, backend in ((DSV3, "flashmla"), (DSV3, "flashinfer"), (LLAMA, "fa3"), (LLAMA, "fa4")):
        must_reject(subject, (*dspark(model), "--attention-backend", backend), (UMF, "DSPARK", backend, "tokenspeed_mla"), model=model, platform=GPU)
        must_accept(subject, (*UM, "--attention-backend", backend), model=model, platform=GPU)
    # Both roles count.
    for prefill, decode in (("triton", "fa3"), ("fa3", "triton")):
        must_reject(
            subject, (*dspark(LLAMA), "--prefill-attention-backend", prefill, "--decode-attention-backend", decode), (UMF, "DSPARK", "fa3"),
            model=LLAMA, platform=GPU,
        )


@contract(
    "UM-NO-HOST-TIERED-CACHE", FN, rules=("K26",), options=OPTIONS,
    rule=f"{UMF} is not compatible with --enable-hierarchical-cache or --enable-lmcache.",
    note="SGLang 0.5.23 refuses only --enable-lmcache in general (hierarchical cache only with EAGLE/EAGLE3).",
)
def um_no_host_tiered(subject) -> None:
    for flag in ("--enable-hierarchical-cache", "--enable-lmcache"):
        must_reject(subject, (*UM_TRITON, flag), (UMF, flag))
        must_accept(subject, ("--attention-backend", "triton", flag))


@contract(
    "UM-DCP-GATE", FN, rules=("K27",), options=OPTIONS,
    rule=f"{UMF} with --dcp-size > 1 runs the DCP checks; --dcp-size 1, or DCP without unified memory, does not.",
)
def um_dcp_gate(subject) -> None:
    must_reject(subject, (*UM_TRITON, "--dcp-size", "2"), (UMF, "--dcp-size"), platform=GPU)
    must_accept(subject, (*UM_TRITON, "--dcp-size", "1"), platform=GPU)
    must_accept(subject, ("--attention-backend", "triton", "--dcp-size", "2"), platform=GPU)
    must_accept(subject, (*UM, "--attention-backend", "flashinfer", "--dcp-size", "2"), model=DSV3, platform=GPU)


@contract(
    "UM-PREFILL-CUDA-GRAPH", FN, rules=("K28",), options=OPTIONS,
    rule=f"{UMF}: an explicit --cuda-graph-backend-prefill other than disabled is a ValueError; otherwise, where prefill "
    "capture would run (CUDA, no --disable-cuda-graph), it is disabled with a WARNING as a declared resolution.",
    note="We model the seed's cuda_graph_config through the resolved field cuda_graph_backend_prefill: unset, "
    "prefill capture defaults to on for CUDA (SGLang's default, 'breakable') and off on CPU or with "
    "--disable-cuda-graph; the resolution sets it to 'disabled'. This engine captures no graphs, so the "
    "resolution is declared and logged and changes nothing at runtime. SGLang 0.5.23 wires prefill capture for "
    "the unified pool: it only falls back from the FULL prefill backend (warning) unless the backends are fa3/fa4, "
    "and never raises.",
)
def um_prefill_cuda_graph(subject) -> None:
    for platform in ("hopper", "sm100"):
        out = must_accept(subject, UM_TRITON, platform=platform)
        require(out.user.get("cuda_graph_backend_prefill") is None, "the user's cuda_graph_backend_prefill must stay unset")
        require(
            out.resolved.get("cuda_graph_backend_prefill") == "disabled",
            f"{UMF} on {platform}: prefill capture must resolve to disabled; resolved "
            f"{out.resolved.get('cuda_graph_backend_prefill')!r}",
        )
        decl = [r for r in out.resolutions if r[1] == "cuda_graph_backend_prefill" and r[2] == "disabled"]
        require(decl, f"disabling prefill capture must be a declared resolution; declared {out.resolutions}")
        hits = warnings_about(out, UMF, "prefill", "cuda-graph")
        require(len(hits) == 1, f"{UMF} on {platform}: expected one WARNING about disabling prefill cuda-graph capture; log {out.log}")
    for backend in ("full", "breakable", "piecewise"):
        for platform in ("hopper", "cpu"):
            must_reject(
                subject, (*UM_TRITON, "--cuda-graph-backend-prefill", backend),
                (UMF, "--cuda-graph-backend-prefill", backend, "disabled"), platform=platform, types=VALUE_TYPES,
            )
    quiet = (
        ((*UM_TRITON, "--cuda-graph-backend-prefill", "disabled"), "hopper"),
        ((*UM_TRITON, "--disable-cuda-graph"), "hopper"),
        (UM_TRITON, "cpu"),
        (("--attention-backend", "triton"), "hopper"),
    )
    for flags, platform in quiet:
        out = must_accept(subject, flags, platform=platform)
        require(not warnings_about(out, "prefill", "cuda-graph"), f"{flags} on {platform}: no prefill-capture warning expected; log {out.log}")
        require(
            not [r for r in out.resolutions if r[1] == "cuda_graph_backend_prefill"],
            f"{flags} on {platform}: prefill capture is already off; nothing to resolve, declared {out.resolutions}",
        )
    must_accept(subject, ("--attention-backend", "triton", "--cuda-graph-backend-prefill", "full"), platform="hopper")


@contract(
    "UM-DCP-MLA-ONLY", DCP_FN, rules=("K29",), options=OPTIONS, rule=f"{UMF} with --dcp-size > 1 supports MLA models only.",
)
def um_dcp_mla_only(subject) -> None:
    for model, backend in ((E2B, "triton"), (LLAMA, "triton"), (LLAMA, "flashinfer")):
        must_reject(subject, (*UM, "--attention-backend", backend, "--dcp-size", "2"), (UMF, "--dcp-size", "MLA"), model=model, platform=GPU)
    for backend in ("flashinfer", "trtllm_mla"):
        must_accept(subject, (*UM, "--attention-backend", backend, "--dcp-size", "2"), model=DSV3, platform=GPU)


@contract(
    "UM-DCP-NO-HYBRID-SWA", DCP_FN, rules=("K30",), options=OPTIONS,
    rule=f"{UMF} with --dcp-size > 1 does not support hybrid sliding-window models (even MLA ones).",
)
def um_dcp_no_hybrid_swa(subject) -> None:
    flags = (*UM, "--attention-backend", "flashinfer")
    must_reject(subject, (*flags, "--dcp-size", "2"), (UMF, "--dcp-size", "sliding-window"), model=MLA_SWA, platform=GPU)
    must_accept(subject, (*flags, "--dcp-size", "1"), model=MLA_SWA, platform=GPU)
    must_accept(subject, (*flags, "--dcp-size", "2"), model=DSV3, platform=GPU)


@contract(
    "UM-DCP-NO-PD", DCP_FN, rules=("K31",), options=OPTIONS,
    rule=f"{UMF} with --dcp-size > 1 does not support PD disaggregation.",
)
def um_dcp_no_pd(subject) -> None:
    flags = (*UM, "--attention-backend", "flashinfer", "--dcp-size", "2")
    for mode in ("decode", "prefill"):
        must_reject(subject, (*flags, "--disaggregation-mode", mode), (UMF, "--dcp-size", "disaggregation"), model=DSV3, platform=GPU)
        must_accept(subject, (*UM, "--attention-backend", "flashinfer", "--disaggregation-mode", mode), model=DSV3, platform=GPU)
    must_accept(subject, flags, model=DSV3, platform=GPU)


@contract(
    "UM-DCP-BACKENDS", DCP_FN, rules=("K32",), options=OPTIONS,
    rule=f"{UMF} with --dcp-size > 1 needs backends within flashinfer, trtllm_mla, cutedsl_mla, tokenspeed_mla.",
    note="SGLang 0.5.23 drops tokenspeed_mla from this set.",
)
def um_dcp_backends(subject) -> None:
    for backend in ("flashinfer", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"):
        must_accept(subject, (*UM, "--attention-backend", backend, "--dcp-size", "2"), model=DSV3, platform=GPU)
    for backend in ("triton", "fa3", "flashmla"):
        must_reject(subject, (*UM, "--attention-backend", backend, "--dcp-size", "2"), (UMF, "--dcp-size", backend), model=DSV3, platform=GPU)
        must_accept(subject, (*UM, "--attention-backend", backend), model=DSV3, platform=GPU)
    must_reject(
        subject,
        (*UM, "--prefill-attention-backend", "flashinfer", "--decode-attention-backend", "triton", "--dcp-size", "2"),
        (UMF, "triton"), model=DSV3, types=ASSERT_TYPES, platform=GPU,
    )
