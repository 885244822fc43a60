"""Seed 004 handle_page_major_kv_layout (K33-K39)."""

from __future__ import annotations

from contracts.base import contract, require
from contracts.expect import must_accept, must_reject
from contracts.models import DSV3, E2B, LLAMA, MIMO, UM, UM_TRITON

# The options of seed 004's hook these rules are about (contracts.base.Contract.options): an engine without
# them is out of scope for these rules.
OPTIONS = (
    "--attention-backend",
    "--decode-attention-backend",
    "--enable-page-major-kv-layout",
    "--enable-unified-memory",
    "--linear-attn-backend",
    "--linear-attn-decode-backend",
    "--linear-attn-prefill-backend",
    "--mamba-backend",
    "--prefill-attention-backend",
)

SEED = "seeds/004"

FN = f"{SEED} handle_page_major_kv_layout"
PMF = "--enable-page-major-kv-layout"
UMF = "--enable-unified-memory"


@contract(
    "UM-IMPLIES-PAGE-MAJOR", FN, rules=("K33",), options=OPTIONS,
    rule=f"{UMF} implies {PMF}: a declared resolution (the user's value stays False), and the page-major checks then "
    "apply without the user passing the flag.",
    note="SGLang's resolving_view is a live view that shows declarations, so the seed's guard after the declaration "
    "sees True; our resolving_view shows user values only, so that guard reads the resolved view.",
)
def um_implies_page_major(subject) -> None:
    for model, flags in ((E2B, UM_TRITON), (DSV3, (*UM, "--attention-backend", "flashinfer"))):
        out = must_accept(subject, flags, model=model)
        require(out.user.get("enable_page_major_kv_layout") is False, "the user's enable_page_major_kv_layout must stay False")
        require(out.resolved.get("enable_page_major_kv_layout") is True, f"{UMF} must resolve enable_page_major_kv_layout to True")
        decl = [r for r in out.resolutions if r[1] == "enable_page_major_kv_layout" and r[2] is True]
        require(decl, f"the implied page-major layout must be a declared resolution; declared {out.resolutions}")
    out = must_accept(subject, (*UM_TRITON, PMF))
    require(out.resolved.get("enable_page_major_kv_layout") is True, f"{UMF} {PMF}: resolved page-major must be True")
    out = must_accept(subject, ("--attention-backend", "triton"))
    require(
        not [r for r in out.resolutions if r[1] == "enable_page_major_kv_layout"],
        f"without {UMF} nothing may declare the page-major layout; declared {out.resolutions}",
    )
    # The implication has teeth: the page-major backend allow-list applies to a bare --enable-unified-memory.
    must_reject(subject, (*UM, "--attention-backend", "torch_native"), (PMF, "torch_native"), model=LLAMA)


@contract(
    "PAGE-MAJOR-NEEDS-UM", FN, rules=("K34",), options=OPTIONS, rule=f"{PMF} without {UMF} is refused (naming both flags).",
)
def page_major_needs_um(subject) -> None:
    for platform in ("cpu", "hopper"):
        must_reject(subject, (PMF, "--attention-backend", "triton"), (PMF, UMF), platform=platform)
    must_reject(subject, (PMF,), (PMF, UMF), model=DSV3)


@contract(
    "UM-UNIFORM-KV-ROWS", FN, rules=("K35",), options=OPTIONS,
    rule=f"{UMF} needs uniform K/V rows (head_dim == v_head_dim, and the same for sliding-window layers) unless the model "
    "is MLA.",
    note="SGLang 0.5.23 moved this model gate to pool construction and instead narrows the backend allow-list for "
    "asymmetric K/V models to {triton, fa3, fa4}. Gemma-4's K/V rows are uniform per layer type (full 512/512, "
    "sliding 256/256): SGLang's head_dim is the full-attention width (our ModelConfig.global_head_dim).",
)
def um_uniform_kv_rows(subject) -> None:
    must_reject(subject, UM_TRITON, (UMF, "head_dim", "v_head_dim", "192", "128"), model=MIMO)
    must_accept(subject, ("--attention-backend", "triton"), model=MIMO)
    must_accept(subject, (*UM, "--attention-backend", "flashinfer"), model=DSV3)
    for model in (E2B, "gemma-4-31B-it", "Llama-3.1-8B-Instruct"):
        must_accept(subject, UM_TRITON, model=model)


@contract(
    "PAGE-MAJOR-BACKENDS", FN, rules=("K36",), options=OPTIONS,
    note="The seed's third branch (plain page-major: {triton}) is unreachable: page-major without unified memory is "
    "refused first (K34). SGLang 0.5.23 drops tokenspeed_mla from the MLA set, has no plain branch, and adds "
    "{triton, fa3, fa4} for asymmetric K/V models.",
)
def page_major_backends(subject) -> None:
    # On Blackwell (sm100), where every backend named here exists (trtllm_mla is Blackwell-only); the MHA lists on a
    # plain MHA model (Llama), which every listed backend serves (Gemma-4's own backend list would refuse fa3 first).
    """With the (implied) page-major layout, the resolved attention backends must be in the allow-list: MLA + unified
    {triton, fa3, trtllm_mla, flashinfer, cutedsl_mla, tokenspeed_mla, flashmla}; MHA + unified {triton, fa3, fa4,
    flashinfer, trtllm_mha}."""
    for backend in ("triton", "fa3", "trtllm_mla", "flashinfer", "cutedsl_mla", "tokenspeed_mla", "flashmla"):
        must_accept(subject, (*UM, "--attention-backend", backend), model=DSV3, platform="sm100")
    for backend in ("fa4", "torch_native", "trtllm_mha"):
        must_reject(subject, (*UM, "--attention-backend", backend), (PMF, backend, "--attention-backend"), model=DSV3,
                    platform="sm100")
    for backend in ("triton", "fa3", "fa4", "flashinfer", "trtllm_mha"):
        must_accept(subject, (*UM, "--attention-backend", backend), model=LLAMA, platform="sm100")
    for backend in ("torch_native", "flashmla", "flex_attention"):
        must_reject(subject, (*UM, "--attention-backend", backend), (PMF, backend, "--attention-backend"), model=LLAMA,
                    platform="sm100")
    # The CPU default (torch_native) is a resolved backend too, and each role counts.
    must_reject(subject, UM, (PMF, "torch_native"), model=LLAMA, platform="cpu")
    must_accept(subject, UM, model=E2B, platform="hopper")
    must_reject(
        subject, (*UM, "--prefill-attention-backend", "triton", "--decode-attention-backend", "flex_attention"),
        (PMF, "flex_attention"), model=LLAMA,
    )


@contract("PAGE-MAJOR-LINEAR-DECODE", FN, rules=("K37",), options=OPTIONS)
def page_major_linear_decode(subject) -> None:
    """With the page-major layout the linear-attention decode backend (--linear-attn-decode-backend, else
    --linear-attn-backend) is triton or flashinfer, plus cutedsl / helion on MLA (KDA-hybrid) models."""
    for backend in ("triton", "flashinfer"):
        must_accept(subject, (*UM_TRITON, "--linear-attn-decode-backend", backend))
    for backend in ("flashkda", "cutedsl", "helion", "nvidia_kda"):
        must_reject(subject, (*UM_TRITON, "--linear-attn-decode-backend", backend), (backend, "DECODE"))
        if backend != "flashkda":  # FlashKDA is prefill-only: an engine may refuse it for decode in general
            must_accept(subject, ("--attention-backend", "triton", "--linear-attn-decode-backend", backend))
    must_reject(subject, (*UM_TRITON, "--linear-attn-backend", "flashkda"), ("flashkda", "DECODE"))
    mla = (*UM, "--attention-backend", "flashinfer")
    for backend in ("cutedsl", "helion", "triton"):
        must_accept(subject, (*mla, "--linear-attn-decode-backend", backend), model=DSV3)
    must_reject(subject, (*mla, "--linear-attn-decode-backend", "flashkda"), ("flashkda", "DECODE"), model=DSV3)


@contract(
    "PAGE-MAJOR-LINEAR-PREFILL", FN, rules=("K38",), options=OPTIONS,
    note="SGLang 0.5.23 also allows flashinfer for prefill.",
)
def page_major_linear_prefill(subject) -> None:
    """With the page-major layout the linear-attention prefill backend (--linear-attn-prefill-backend, else
    --linear-attn-backend) is triton or flashkda, plus cutedsl / helion on MLA (KDA-hybrid) models."""
    for backend in ("triton", "flashkda"):
        must_accept(subject, (*UM_TRITON, "--linear-attn-prefill-backend", backend))
    for backend in ("flashinfer", "cutedsl", "helion"):
        must_reject(subject, (*UM_TRITON, "--linear-attn-prefill-backend", backend), (backend, "PREFILL"))
        must_accept(subject, ("--attention-backend", "triton", "--linear-attn-prefill-backend", backend))
    mla = (*UM, "--attention-backend", "flashinfer")
    for backend in ("cutedsl", "helion", "flashkda"):
        must_accept(subject, (*mla, "--linear-attn-prefill-backend", backend), model=DSV3)
    # flashinfer passes the decode list but not the prefill one.
    must_reject(subject, (*mla, "--linear-attn-backend", "flashinfer"), ("flashinfer", "PREFILL"), model=DSV3)


@contract("PAGE-MAJOR-MAMBA", FN, rules=("K39",), options=OPTIONS)
def page_major_mamba(subject) -> None:
    """With the page-major layout --mamba-backend must be unset or triton."""
    must_reject(subject, (*UM_TRITON, "--mamba-backend", "flashinfer"), ("--mamba-backend", "flashinfer", "triton"))
    must_accept(subject, (*UM_TRITON, "--mamba-backend", "triton"))
    must_accept(subject, ("--attention-backend", "triton", "--mamba-backend", "flashinfer"))
