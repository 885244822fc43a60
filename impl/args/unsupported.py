"""Honest refusal of settings whose feature this engine does not have.

``check_server_args`` validates settings the way SGLang does (seed 004 and the
others), so a setting can be *valid* and still name a feature that does not
exist here (PD disaggregation, hierarchical cache, FP4 KV, ...). The engine
calls ``refuse_unimplemented(server_args)`` at launch, after validation: every
such setting is listed in ONE ValueError, with its flag, so the operator sees
them all at once. Nothing is silently ignored.

Reads the resolved view (after ``check_server_args``, the effective values; before
it, the user's); a listed flag the user did not set is marked as implied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from impl.args.resolution import attention_backends_of, resolved_view, resolving_view
from impl.args.server_args import IMPLEMENTED_ATTENTION_BACKENDS

# KV-cache dtypes the pool stores: auto (the model dtype), bf16, and fp8 (e4m3 / e5m2, per-layer scales,
# dequantised in every attention kernel: impl/cache/kv_quant.py). The block-scaled FP4 / MXFP8 formats are
# refused.
IMPLEMENTED_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
IMPLEMENTED_PREFILL_CUDA_GRAPH = (None, "disabled")


@dataclass(frozen=True)
class Unimplemented:
    """One feature this engine lacks: ``present(view)`` says which of its flags the settings use."""

    feature: str
    present: Callable[[Any], list[str]]


def _flags(view: Any, **tests: Callable[[Any], bool]) -> list[str]:
    """``--name`` (with the value, for non-booleans) for every field whose test holds."""
    out = []
    for name, test in tests.items():
        value = getattr(view, name)
        if test(value):
            flag = "--" + name.replace("_", "-")
            out.append(flag if isinstance(value, bool) else f"{flag} {value}")
    return out


def _true(v: Any) -> bool:
    return bool(v)


def _set(v: Any) -> bool:
    return v is not None


def _above_one(v: Any) -> bool:
    return v is not None and v > 1


def _attention_backends(view: Any) -> list[str]:
    out = []
    for name in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        value = getattr(view, name)
        if value is not None and value not in IMPLEMENTED_ATTENTION_BACKENDS:
            out.append(f"--{name.replace('_', '-')} {value}")
    if not out:
        # A role backend inherited from a resolved default is still checked.
        for role, value in zip(("prefill", "decode"), attention_backends_of(view)):
            if value is not None and value not in IMPLEMENTED_ATTENTION_BACKENDS:
                out.append(f"--{role}-attention-backend {value}")
    return out


UNIMPLEMENTED: list[Unimplemented] = [
    Unimplemented(
        "PD disaggregation",
        lambda v: _flags(
            v,
            disaggregation_mode=lambda x: x != "null",
            disaggregation_transfer_backend=lambda x: x != "mooncake",
            disaggregation_decode_retraction_backup=_set,
            disaggregation_decode_enable_offload_kvcache=_true,
        ),
    ),
    Unimplemented(
        "hierarchical (host-tiered) KV cache",
        lambda v: _flags(v, enable_hierarchical_cache=_true, hicache_storage_backend=_set),
    ),
    Unimplemented("LMCache", lambda v: _flags(v, enable_lmcache=_true)),
    Unimplemented("the unified memory pool", lambda v: _flags(v, enable_unified_memory=_true)),
    Unimplemented("the page-major KV layout", lambda v: _flags(v, enable_page_major_kv_layout=_true)),
    Unimplemented("HiSparse attention", lambda v: _flags(v, enable_hisparse=_true)),
    Unimplemented("context parallelism", lambda v: _flags(v, attn_cp_size=_above_one, enable_prefill_cp=_true)),
    Unimplemented("decode context parallelism", lambda v: _flags(v, dcp_size=_above_one)),
    Unimplemented("tensor / pipeline parallelism", lambda v: _flags(v, tp_size=_above_one, pp_size=_above_one)),
    Unimplemented(
        "attention backends other than " + "/".join(IMPLEMENTED_ATTENTION_BACKENDS) + " (MLA, FlashAttention, FlashInfer, TRT-LLM, ...)",
        _attention_backends,
    ),
    Unimplemented(
        "linear-attention and Mamba layers",
        lambda v: _flags(
            v, linear_attn_backend=_set, linear_attn_prefill_backend=_set, linear_attn_decode_backend=_set, mamba_backend=_set
        ),
    ),
    Unimplemented(
        "KV-cache dtypes other than " + "/".join(IMPLEMENTED_KV_CACHE_DTYPES) + " (FP4, MXFP8)",
        lambda v: _flags(v, kv_cache_dtype=lambda x: x not in IMPLEMENTED_KV_CACHE_DTYPES),
    ),
    Unimplemented(
        "prefill-only embedding serving",
        lambda v: _flags(v, prefill_only_disable_kv_cache=_true, is_embedding=_true),
    ),
    Unimplemented(
        "speculative decoding other than FROZEN_KV_MTP (NEXTN with a Gemma-4 assistant draft)",
        lambda v: [] if v.speculative_algorithm == "FROZEN_KV_MTP" else _flags(
            v,
            speculative_algorithm=_set,
            speculative_draft_model_path=_set,
            speculative_num_steps=_set,
            speculative_eagle_topk=_set,
            speculative_num_draft_tokens=_set,
        ),
    ),
    Unimplemented(
        "priority scheduling",
        lambda v: _flags(v, enable_priority_scheduling=_true, disable_priority_preemption=_true),
    ),
    Unimplemented(
        "prefill cuda-graph capture",
        lambda v: _flags(v, cuda_graph_backend_prefill=lambda x: x not in IMPLEMENTED_PREFILL_CUDA_GRAPH),
    ),
]


def unimplemented_settings(server_args: Any) -> list[tuple[str, list[str]]]:
    """(feature, flags) for every feature the settings ask for that this engine lacks."""
    view, user = resolved_view(server_args), resolving_view(server_args)
    found = []
    for item in UNIMPLEMENTED:
        typed = {f.split()[0] for f in item.present(user)}
        # A flag the user did not set was implied by another setting (a declared resolution).
        flags = [f if f.split()[0] in typed else f"{f} (implied by other settings)" for f in item.present(view)]
        if flags:
            found.append((item.feature, flags))
    return found


def refuse_unimplemented(server_args: Any) -> None:
    """Raise one ValueError listing every setting whose feature this engine does not implement."""
    found = unimplemented_settings(server_args)
    if not found:
        return
    lines = "\n".join(f"  - {feature}: {', '.join(flags)}" for feature, flags in found)
    raise ValueError(
        "These settings are valid, but this engine does not implement their features (Gemma-4 with the "
        f"triton / torch_native attention backends on one device):\n{lines}\n"
        "Drop these flags (or use an engine that implements them); nothing is silently ignored."
    )
