"""KV-cache dtype and pool compatibility (seed 004): rules K1-K47 of RULES.md.

One function per seed function, same names, defined in the seed's order; each
rule is one small helper named for it (its K id in a comment) so a reader can
find it and a mutant can break exactly one rule. Allow-lists are module
constants with the seed's values.

Views, as in the seed: ``resolving_view`` is what the user typed, ``resolved_view``
applies every declared resolution (the attention-backend default, ...). One
place differs in form: SGLang's ``resolving_view`` is a *live* view that already
shows declarations, and ``handle_page_major_kv_layout`` relies on that ("set
before the guard"); ours shows only user values, so that guard reads the
resolved view.

Where the seed ``assert``s on user input we raise ValueError (asserts vanish
under ``python -O``); every message names the flags involved and the fix.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from impl.args.resolution import (
    attention_backends_of,
    declare_resolution,
    model_config_of,
    platform_of,
    resolved_view,
    resolving_view,
    use_mla_backend,
)
from impl.envs import envs

logger = logging.getLogger("impl.args")

# ---- allow-lists (the seed's values; SGLang 0.5.23's are in docs/contracts.md) ----
FP4_KV_DTYPES = ("nvfp4", "fp4_mx_block16")
KV4_FA4_MLA_DECODE_BACKENDS = ("cutlass_mla", "flashinfer", "trtllm_mla")  # K4
KV4_FA4_MHA_DECODE_BACKENDS = ("triton", "torch_native", "flex_attention")  # K5
KV4_MLA_ATTENTION_BACKENDS = ("cutlass_mla", "flashinfer", "trtllm_mla")  # K6
KV4_MHA_ATTENTION_BACKENDS = ("triton", "torch_native", "flex_attention", "trtllm_mha")  # K7
PREFILL_ONLY_PREFILL_BACKENDS = ("fa3", "fa4")  # K10
UNIFIED_PD_TRANSFER_BACKENDS = ("mooncake",)  # K19
UNIFIED_SPECULATIVE_ALGORITHMS = (None, "DSPARK")  # K23
UNIFIED_DSPARK_TOPK = (None, 1)  # K24
UNIFIED_DSPARK_BACKENDS = frozenset({"triton", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"})  # K25
UNIFIED_DCP_BACKENDS = frozenset({"flashinfer", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"})  # K32
PAGE_MAJOR_UNIFIED_MLA_BACKENDS = frozenset(
    {"triton", "fa3", "trtllm_mla", "flashinfer", "cutedsl_mla", "tokenspeed_mla", "flashmla"}
)  # K36
PAGE_MAJOR_UNIFIED_MHA_BACKENDS = frozenset({"triton", "fa3", "fa4", "flashinfer", "trtllm_mha"})  # K36
PAGE_MAJOR_PLAIN_BACKENDS = frozenset({"triton"})  # K36 (unreachable in the seed: K34 refuses first)
LINEAR_DECODE_BACKENDS = frozenset({"triton", "flashinfer"})  # K37
LINEAR_PREFILL_BACKENDS = frozenset({"triton", "flashkda"})  # K38
LINEAR_MLA_EXTRA_BACKENDS = frozenset({"cutedsl", "helion"})  # K37/K38: KDA-hybrid (MLA) models only
MAMBA_BACKENDS = (None, "triton")  # K39
LAZY_COMPACTION_ENV = envs.YOCO_DISABLE_LAZY_COMPACTION.name

# SGLang's default prefill cuda-graph capture backend on CUDA ("breakable"; the
# seed's era called it piecewise); off CUDA, and with --disable-cuda-graph, prefill
# capture is off. This engine captures no graphs at all: the K28 resolution is
# declared and logged like the seed's, and changes nothing at runtime.
CUDA_DEFAULT_PREFILL_CUDA_GRAPH_BACKEND = "breakable"


def _backends_text(backends: Iterable[Any]) -> str:
    return str(sorted(b for b in backends if b is not None))


def _kv_row_dims(mc: Any) -> tuple[int, int, int, int]:
    """(head_dim, v_head_dim, swa_head_dim, swa_v_head_dim) in SGLang's sense.

    SGLang's ``head_dim`` is the full-attention K width; our ModelConfig keeps
    Gemma-4's sliding width in ``head_dim`` and the full one in ``global_head_dim``
    (equal to ``head_dim`` for every other model).
    """
    full_k = mc.global_head_dim or mc.head_dim
    return full_k, mc.v_head_dim, mc.swa_head_dim, mc.swa_v_head_dim


def has_asymmetric_kv(mc: Any) -> bool:
    head_dim, v_head_dim, swa_head_dim, swa_v_head_dim = _kv_row_dims(mc)
    return head_dim != v_head_dim or swa_head_dim != swa_v_head_dim


def unified_memory_supported_for_model(mc: Any, use_mla_backend: bool) -> bool:
    """Whether the model's KV geometry can back the unified pool: MLA, or uniform K/V rows."""
    return use_mla_backend or not has_asymmetric_kv(mc)


def prefill_cuda_graph_backend(server_args: Any) -> str:
    """The effective prefill capture backend (SGLang's ``cuda_graph_config.prefill.backend``).

    An explicit ``--cuda-graph-backend-prefill`` wins over ``--disable-cuda-graph``,
    which wins over the platform default.
    """
    view = resolved_view(server_args)
    if view.cuda_graph_backend_prefill is not None:
        return view.cuda_graph_backend_prefill
    if view.disable_cuda_graph:
        return "disabled"
    return CUDA_DEFAULT_PREFILL_CUDA_GRAPH_BACKEND if platform_of(server_args).is_cuda else "disabled"


# =============================================================================
# handle_mxfp8_kv_cache_compatibility
# =============================================================================
def handle_mxfp8_kv_cache_compatibility(server_args: Any) -> None:
    """MXFP8 KV uses block-scaled operands that exist only on SM100+ (Blackwell)."""
    cfg = resolving_view(server_args)
    if cfg.kv_cache_dtype != "mxfp8":
        return
    _mxfp8_needs_blackwell(server_args)


def _mxfp8_needs_blackwell(server_args: Any) -> None:  # K1
    platform = platform_of(server_args)
    if not platform.is_blackwell:
        raise ValueError(
            "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU for the block-scaled operands used by "
            f"the FA4 MXFP8 attention path; this platform is {platform.name}. Use --kv-cache-dtype auto, bf16 "
            "or fp8_e4m3 here."
        )


# =============================================================================
# handle_kv4_compatibility
# =============================================================================
def handle_kv4_compatibility(server_args: Any) -> None:
    """FP4 KV (nvfp4 / fp4_mx_block16) against the platform and the attention backends."""
    cfg = resolving_view(server_args)
    if cfg.kv_cache_dtype not in FP4_KV_DTYPES:
        return
    uses_mla = use_mla_backend(server_args)
    prefill_backend, decode_backend = attention_backends_of(resolved_view(server_args))
    attention_backend = resolved_view(server_args).attention_backend
    dtype = cfg.kv_cache_dtype

    if not platform_of(server_args).is_cuda:
        _kv4_not_on_non_cuda(server_args, dtype)  # K8
        return
    _nvfp4_needs_sm100_or_sm120(server_args, dtype)  # K2
    if prefill_backend != decode_backend and prefill_backend != "fa4":
        _warn_kv4_mixed_backends(dtype, prefill_backend, decode_backend)  # K3 (nothing else is checked)
        return
    if prefill_backend == "fa4":
        if uses_mla:
            _kv4_fa4_mla_decode(dtype, decode_backend)  # K4
        else:
            _kv4_fa4_mha_decode(dtype, decode_backend)  # K5
    else:
        if uses_mla:
            _kv4_mla_attention(dtype, attention_backend)  # K6
        else:
            _kv4_mha_attention(dtype, attention_backend)  # K7


def _kv4_not_on_non_cuda(server_args: Any, dtype: str) -> None:  # K8
    raise RuntimeError(
        f"--kv-cache-dtype={dtype}: KV4 is not tested on non-CUDA platforms (this platform is "
        f"{platform_of(server_args).name}). Use --kv-cache-dtype auto or bf16 here."
    )


def _nvfp4_needs_sm100_or_sm120(server_args: Any, dtype: str) -> None:  # K2
    platform = platform_of(server_args)
    if dtype == "nvfp4" and not (platform.is_sm100 or platform.is_sm120):
        raise RuntimeError(
            f"--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120 (this GPU is {platform.name}, compute "
            f"capability {platform.compute_capability}). Use --kv-cache-dtype=fp4_mx_block16 for the "
            "block-size-16 FP4 recipe."
        )


def _warn_kv4_mixed_backends(dtype: str, prefill_backend: Any, decode_backend: Any) -> None:  # K3
    logger.warning(
        "Attention: Using KV4 (--kv-cache-dtype=%s) with PREFILL = %s and DECODE = %s. "
        "Compatibility issues are unlikely, but may occur in rare edge cases.",
        dtype,
        prefill_backend,
        decode_backend,
    )


_DECODE_BACKEND = "the decode backend (--decode-attention-backend, else --attention-backend)"


def _kv4_expect(dtype: str, backend: Any, allowed: tuple[str, ...], setting: str, role: str) -> None:
    """K4-K7: with KV4 in ``setting`` (a model kind, and the fa4 prefill backend or not), ``role`` must be one of
    ``allowed``."""
    if backend not in allowed:
        raise ValueError(
            f"--kv-cache-dtype={dtype} {setting} expects {role} to be one of {list(allowed)}, but got {backend}."
        )


def _kv4_fa4_mla_decode(dtype: str, decode_backend: Any) -> None:  # K4
    _kv4_expect(dtype, decode_backend, KV4_FA4_MLA_DECODE_BACKENDS,
                "with the fa4 prefill backend on an MLA model (KV4 FA4 MLA)", _DECODE_BACKEND)


def _kv4_fa4_mha_decode(dtype: str, decode_backend: Any) -> None:  # K5
    _kv4_expect(dtype, decode_backend, KV4_FA4_MHA_DECODE_BACKENDS,
                "with the fa4 prefill backend on an MHA model (KV4 FA4 MHA)", _DECODE_BACKEND)


def _kv4_mla_attention(dtype: str, attention_backend: Any) -> None:  # K6
    _kv4_expect(dtype, attention_backend, KV4_MLA_ATTENTION_BACKENDS, "on an MLA model (KV4 MLA)", "--attention-backend")


def _kv4_mha_attention(dtype: str, attention_backend: Any) -> None:  # K7
    _kv4_expect(dtype, attention_backend, KV4_MHA_ATTENTION_BACKENDS, "on an MHA model (KV4 MHA)", "--attention-backend")


# =============================================================================
# handle_prefill_only_disable_kv_cache (the backend half; runs after backends resolve)
# =============================================================================
def handle_prefill_only_disable_kv_cache(server_args: Any) -> None:
    cfg = resolving_view(server_args)
    if not cfg.prefill_only_disable_kv_cache:
        return
    # K9: an internal ordering guard (not user input): before the attention-backend
    # default has run, the resolved (prefill, decode) pair would be a stale (None, None).
    if resolved_view(server_args).attention_backend is None:
        raise RuntimeError(
            "handle_prefill_only_disable_kv_cache must run after the attention-backend default is resolved, so "
            "the prefill backend checked for --prefill-only-disable-kv-cache is the one that will run."
        )
    prefill_backend, _ = attention_backends_of(resolved_view(server_args))
    _prefill_only_needs_fa_prefill(prefill_backend)  # K10


def _prefill_only_needs_fa_prefill(prefill_backend: Any) -> None:  # K10
    if prefill_backend not in PREFILL_ONLY_PREFILL_BACKENDS:
        raise ValueError(
            "--prefill-only-disable-kv-cache currently requires the FA prefill backend "
            f"({'/'.join(PREFILL_ONLY_PREFILL_BACKENDS)}), but got prefill backend {prefill_backend!r}. Pass "
            "--attention-backend fa3 (or --prefill-attention-backend fa3/fa4). Other prefill-only workloads and "
            "backends may be supported in a future change."
        )


# =============================================================================
# handle_cache_compatibility
# =============================================================================
def handle_cache_compatibility(server_args: Any) -> None:
    cfg = resolving_view(server_args)
    _host_pool_needs_pd_decode(cfg)  # K11
    _host_pool_without_dcp(cfg)  # K12
    _host_pool_priority_needs_no_preemption(cfg)  # K13
    _hierarchical_cache_needs_radix(cfg)  # K14
    if cfg.disaggregation_decode_enable_offload_kvcache:
        _decode_offload_on_decode_side(cfg)  # K15
        _decode_offload_needs_storage(cfg)  # K16
        _decode_offload_not_with_host_pool(cfg)  # K17
    # The effective ratio: a model branch may declare a reset that supersedes the user's value.
    _swa_full_tokens_ratio_in_range(resolved_view(server_args).swa_full_tokens_ratio)  # K18


def _host_pool_needs_pd_decode(cfg: Any) -> None:  # K11
    if cfg.disaggregation_decode_retraction_backup == "host_pool" and cfg.disaggregation_mode != "decode":
        raise ValueError(
            "--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server "
            f"(--disaggregation-mode decode); got --disaggregation-mode {cfg.disaggregation_mode}."
        )


def _host_pool_without_dcp(cfg: Any) -> None:  # K12
    if cfg.disaggregation_decode_retraction_backup == "host_pool" and cfg.dcp_size > 1:
        raise ValueError(
            f"--disaggregation-decode-retraction-backup=host_pool does not support --dcp-size > 1 (got "
            f"--dcp-size {cfg.dcp_size})."
        )


def _host_pool_priority_needs_no_preemption(cfg: Any) -> None:  # K13
    if (
        cfg.disaggregation_decode_retraction_backup == "host_pool"
        and cfg.enable_priority_scheduling
        and not cfg.disable_priority_preemption
    ):
        raise ValueError(
            "--disaggregation-decode-retraction-backup=host_pool requires --disable-priority-preemption when "
            "priority scheduling is enabled (--enable-priority-scheduling)."
        )


def _hierarchical_cache_needs_radix(cfg: Any) -> None:  # K14
    if cfg.enable_hierarchical_cache and cfg.disable_radix_cache:
        raise ValueError(
            "The arguments --enable-hierarchical-cache and --disable-radix-cache are mutually exclusive and "
            "cannot be used at the same time. Please use only one of them."
        )


def _decode_offload_on_decode_side(cfg: Any) -> None:  # K15
    if cfg.disaggregation_mode != "decode":
        raise ValueError(
            "The argument --disaggregation-decode-enable-offload-kvcache is only supported for the decode side "
            f"(--disaggregation-mode decode); got --disaggregation-mode {cfg.disaggregation_mode}."
        )


def _decode_offload_needs_storage(cfg: Any) -> None:  # K16
    if cfg.hicache_storage_backend is None:
        raise ValueError(
            "The argument --disaggregation-decode-enable-offload-kvcache is only supported when "
            "--hicache-storage-backend is provided."
        )


def _decode_offload_not_with_host_pool(cfg: Any) -> None:  # K17
    if cfg.disaggregation_decode_retraction_backup == "host_pool":
        raise ValueError(
            "The arguments --disaggregation-decode-enable-offload-kvcache and "
            "--disaggregation-decode-retraction-backup=host_pool are mutually exclusive: both build a decode "
            "host pool."
        )


def _swa_full_tokens_ratio_in_range(ratio: float) -> None:  # K18
    if not (0 < ratio <= 1.0):
        raise ValueError(f"--swa-full-tokens-ratio should be in range (0, 1.0]; got {ratio}.")


# =============================================================================
# handle_unified_memory_pool
# =============================================================================
def handle_unified_memory_pool(server_args: Any) -> None:
    cfg = resolving_view(server_args)
    if not cfg.enable_unified_memory:
        return
    if cfg.disaggregation_mode != "null":
        # Constraints of the whole-envelope KV transfer.
        _unified_pd_transfer_backend(cfg)  # K19
        _unified_pd_no_pipeline_parallel(cfg)  # K20
        _unified_pd_lazy_compaction(cfg)  # K21
        _unified_pd_no_hisparse(cfg)  # K22
    _unified_speculative_algorithm(cfg)  # K23
    if cfg.speculative_algorithm == "DSPARK":
        _unified_dspark_topk(cfg)  # K24
        # Both roles: verify routes to either backend depending on the speculative attention mode.
        _unified_dspark_backends(server_args)  # K25
    _unified_no_host_tiered_cache(cfg)  # K26
    if cfg.dcp_size > 1:
        _validate_unified_memory_dcp(server_args)  # K27 -> K29-K32
    _unified_prefill_cuda_graph(server_args, cfg)  # K28


def _unified_pd_transfer_backend(cfg: Any) -> None:  # K19
    if cfg.disaggregation_transfer_backend not in UNIFIED_PD_TRANSFER_BACKENDS:
        raise ValueError(
            "--enable-unified-memory with PD disaggregation (--disaggregation-mode "
            f"{cfg.disaggregation_mode}) supports only the {'/'.join(UNIFIED_PD_TRANSFER_BACKENDS)} transfer "
            f"backend; got --disaggregation-transfer-backend {cfg.disaggregation_transfer_backend!r}."
        )


def _unified_pd_no_pipeline_parallel(cfg: Any) -> None:  # K20
    if cfg.pp_size != 1:
        raise ValueError(
            f"--enable-unified-memory with PD disaggregation (--disaggregation-mode {cfg.disaggregation_mode}) "
            f"does not support pipeline parallelism (got --pp-size {cfg.pp_size}): the whole-envelope transfer "
            "has no per-layer entries to subset."
        )


def _unified_pd_lazy_compaction(cfg: Any) -> None:  # K21
    if envs.YOCO_DISABLE_LAZY_COMPACTION.get():
        raise ValueError(
            f"--enable-unified-memory with PD disaggregation (--disaggregation-mode {cfg.disaggregation_mode}) "
            f"requires lazy compaction; unset {LAZY_COMPACTION_ENV}."
        )


def _unified_pd_no_hisparse(cfg: Any) -> None:  # K22
    if cfg.enable_hisparse:
        raise ValueError(
            f"--enable-unified-memory with PD disaggregation (--disaggregation-mode {cfg.disaggregation_mode}) "
            "is not compatible with --enable-hisparse: the decode-side HiSparse prealloc path ships rows "
            "straight from the allocator, bypassing the virtual->physical translation the unified pool needs."
        )


def _unified_speculative_algorithm(cfg: Any) -> None:  # K23
    if cfg.speculative_algorithm not in UNIFIED_SPECULATIVE_ALGORITHMS:
        raise ValueError(
            "--enable-unified-memory only supports --speculative-algorithm DSPARK (chain draft); other "
            "speculative algorithms are not yet audited for the unified pool's loc translation. Got "
            f"--speculative-algorithm={cfg.speculative_algorithm!r}."
        )


def _unified_dspark_topk(cfg: Any) -> None:  # K24
    if cfg.speculative_eagle_topk not in UNIFIED_DSPARK_TOPK:
        raise ValueError(
            "--enable-unified-memory + --speculative-algorithm DSPARK supports a linear draft chain only "
            "(--speculative-eagle-topk in {None, 1}); tree verify is not audited for the unified pool. Got "
            f"--speculative-eagle-topk={cfg.speculative_eagle_topk!r}."
        )


def _unified_dspark_backends(server_args: Any) -> None:  # K25
    backends = {b for b in attention_backends_of(resolved_view(server_args)) if b is not None}
    if not backends <= UNIFIED_DSPARK_BACKENDS:
        raise ValueError(
            "--enable-unified-memory + --speculative-algorithm DSPARK requires spec-verify-audited attention "
            f"backends {sorted(UNIFIED_DSPARK_BACKENDS)} for both prefill and decode (--attention-backend / "
            f"--prefill-attention-backend / --decode-attention-backend); got {sorted(backends)}."
        )


def _unified_no_host_tiered_cache(cfg: Any) -> None:  # K26
    if cfg.enable_hierarchical_cache or cfg.enable_lmcache:
        raise ValueError(
            "--enable-unified-memory is not yet compatible with hierarchical / host-tiered KV cache "
            "(--enable-hierarchical-cache / --enable-lmcache): the unified pool wires up no host pools and its "
            "device slots are virtual."
        )


def _unified_prefill_cuda_graph(server_args: Any, cfg: Any) -> None:  # K28
    """Only decode capture is wired for the unified pool; prefill capture is not."""
    if prefill_cuda_graph_backend(server_args) == "disabled":
        return
    if cfg.cuda_graph_backend_prefill is not None:
        raise ValueError(
            "--enable-unified-memory supports decode cuda-graph capture only; prefill capture is not wired (the "
            "prefill graph runner bypasses the unified virtual->physical loc rebind). Got "
            f"--cuda-graph-backend-prefill={cfg.cuda_graph_backend_prefill!r}; pass "
            "--cuda-graph-backend-prefill=disabled."
        )
    declare_resolution(server_args, "handle_unified_memory_pool", cuda_graph_backend_prefill="disabled")
    logger.warning(
        "--enable-unified-memory: disabling prefill cuda-graph capture (--cuda-graph-backend-prefill=disabled; "
        "not wired for the unified pool's loc rebind); decode capture is unaffected."
    )


def _validate_unified_memory_dcp(server_args: Any) -> None:
    """Gate --enable-unified-memory + --dcp-size > 1 to the audited path (K29-K32)."""
    _unified_dcp_mla_only(server_args)  # K29
    _unified_dcp_no_hybrid_swa(server_args)  # K30
    _unified_dcp_no_pd(resolving_view(server_args))  # K31
    _unified_dcp_backends(server_args)  # K32


def _unified_dcp_mla_only(server_args: Any) -> None:  # K29
    if not use_mla_backend(server_args):
        raise ValueError(
            "--enable-unified-memory with decode context parallelism (--dcp-size > 1) supports MLA models only: "
            f"the MHA unified pool has no DCP-aware masked write path, and {model_config_of(server_args).name} "
            "is not an MLA model."
        )


def _unified_dcp_no_hybrid_swa(server_args: Any) -> None:  # K30
    if model_config_of(server_args).is_hybrid_swa:
        raise ValueError(
            "--enable-unified-memory with decode context parallelism (--dcp-size > 1) does not support hybrid "
            f"sliding-window models ({model_config_of(server_args).name}): the SWA allocator does not widen its "
            "virtual id space, and the full->swa mapping is not DCP-sharded."
        )


def _unified_dcp_no_pd(cfg: Any) -> None:  # K31
    if cfg.disaggregation_mode != "null":
        raise ValueError(
            "--enable-unified-memory with decode context parallelism (--dcp-size > 1) does not support PD "
            f"disaggregation (got --disaggregation-mode {cfg.disaggregation_mode}): the transfer ships whole page "
            "envelopes, which under DCP hold only this rank's shard of each widened page."
        )


def _unified_dcp_backends(server_args: Any) -> None:  # K32
    backends = {b for b in attention_backends_of(resolved_view(server_args)) if b is not None}
    if not backends <= UNIFIED_DCP_BACKENDS:
        raise ValueError(
            "--enable-unified-memory with decode context parallelism (--dcp-size > 1) requires "
            f"{sorted(UNIFIED_DCP_BACKENDS)} for the full-attention layers (--attention-backend); got "
            f"{sorted(backends)}. The other paged MLA backends do not translate their block table through the "
            "unified pool's virtual->physical page table."
        )


# =============================================================================
# handle_page_major_kv_layout
# =============================================================================
def handle_page_major_kv_layout(server_args: Any) -> None:
    # The unified pool stores state in the page-major envelope-strided layout, so
    # enabling it implies --enable-page-major-kv-layout (declared before the guard).
    cfg = resolving_view(server_args)
    if cfg.enable_unified_memory:
        _declare_page_major_for_unified(server_args)  # K33
    # The seed reads its live resolving view here, which shows the declaration above.
    if not resolved_view(server_args).enable_page_major_kv_layout:
        return
    _page_major_needs_unified(cfg)  # K34
    _unified_needs_uniform_kv_rows(server_args)  # K35
    _page_major_attention_backends(server_args, cfg)  # K36
    _page_major_linear_attn_backends(server_args, cfg)  # K37, K38
    _page_major_mamba_backend(cfg)  # K39


def _declare_page_major_for_unified(server_args: Any) -> None:  # K33
    declare_resolution(server_args, "handle_page_major_kv_layout", enable_page_major_kv_layout=True)


def _page_major_needs_unified(cfg: Any) -> None:  # K34
    if not cfg.enable_unified_memory:
        raise ValueError(
            "--enable-page-major-kv-layout without --enable-unified-memory is temporarily unsupported: the "
            "strided MHA K/V views were removed and the static-pool page-major layout awaits its per-layer-view "
            "reimplementation. Run with --enable-unified-memory, or drop --enable-page-major-kv-layout."
        )


def _unified_needs_uniform_kv_rows(server_args: Any) -> None:  # K35
    mc = model_config_of(server_args)
    if not unified_memory_supported_for_model(mc, use_mla_backend=use_mla_backend(server_args)):
        head_dim, v_head_dim, swa_head_dim, swa_v_head_dim = _kv_row_dims(mc)
        raise ValueError(
            "--enable-unified-memory requires uniform K/V rows (head_dim == v_head_dim, and the same for the "
            f"sliding-window layers); {mc.name} has head_dim={head_dim}, v_head_dim={v_head_dim}, "
            f"swa_head_dim={swa_head_dim}, swa_v_head_dim={swa_v_head_dim}. The unified pool's per-layer views "
            "require a uniform row width; run this model without --enable-unified-memory."
        )


def page_major_allowed_backends(server_args: Any, cfg: Any) -> frozenset[str]:
    """K36's allow-list; names are the resolved ids from attention_backends_of."""
    if cfg.enable_unified_memory and use_mla_backend(server_args):
        return PAGE_MAJOR_UNIFIED_MLA_BACKENDS
    if cfg.enable_unified_memory:
        return PAGE_MAJOR_UNIFIED_MHA_BACKENDS
    return PAGE_MAJOR_PLAIN_BACKENDS


def _page_major_attention_backends(server_args: Any, cfg: Any) -> None:  # K36
    allowed = page_major_allowed_backends(server_args, cfg)
    backends = {b for b in attention_backends_of(resolved_view(server_args)) if b is not None}
    if not backends <= allowed:
        kind = "MLA" if use_mla_backend(server_args) else "MHA"
        raise ValueError(
            "--enable-page-major-kv-layout (implied by --enable-unified-memory): the resolved attention backends "
            f"{sorted(backends)} are not in the allowed set {sorted(allowed)} for this configuration ({kind} "
            "model; unified memory allows the per-layer-view families, plain page-major only Triton). Pass a "
            "compatible --attention-backend."
        )


def _linear_attn_allowed(server_args: Any, base: frozenset[str]) -> frozenset[str]:
    # KDA-hybrid models (MLA hosts) may also use the stride-safe cutedsl / helion kernels.
    return base | LINEAR_MLA_EXTRA_BACKENDS if use_mla_backend(server_args) else base


def _page_major_linear_attn_backends(server_args: Any, cfg: Any) -> None:  # K37, K38
    decode_allowed = _linear_attn_allowed(server_args, LINEAR_DECODE_BACKENDS)
    prefill_allowed = _linear_attn_allowed(server_args, LINEAR_PREFILL_BACKENDS)
    decode = cfg.linear_attn_decode_backend or cfg.linear_attn_backend
    prefill = cfg.linear_attn_prefill_backend or cfg.linear_attn_backend
    if decode not in decode_allowed | {None}:  # K37
        raise ValueError(
            "--enable-page-major-kv-layout (implied by --enable-unified-memory): the linear-attention DECODE "
            f"backend (--linear-attn-decode-backend, else --linear-attn-backend) must be one of "
            f"{sorted(decode_allowed)} for the strided conv/SSM state; got {decode!r}."
        )
    if prefill not in prefill_allowed | {None}:  # K38
        raise ValueError(
            "--enable-page-major-kv-layout (implied by --enable-unified-memory): the linear-attention PREFILL "
            f"backend (--linear-attn-prefill-backend, else --linear-attn-backend) must be one of "
            f"{sorted(prefill_allowed)} for the strided conv/SSM state; got {prefill!r}."
        )


def _page_major_mamba_backend(cfg: Any) -> None:  # K39
    if cfg.mamba_backend not in MAMBA_BACKENDS:
        raise ValueError(
            "--enable-page-major-kv-layout (implied by --enable-unified-memory) requires the Triton Mamba kernels "
            f"for the strided conv/SSM state; got --mamba-backend {cfg.mamba_backend!r}. Pass --mamba-backend triton."
        )


# =============================================================================
# validate_prefill_only_disable_kv_cache_args (flag / precondition half)
# =============================================================================
def validate_prefill_only_disable_kv_cache_args(server_args: Any) -> None:
    """--prefill-only-disable-kv-cache preconditions; the backend half is handle_prefill_only_disable_kv_cache."""
    cfg = resolving_view(server_args)
    if not cfg.prefill_only_disable_kv_cache:
        return
    _prefill_only_needs_embedding(cfg)  # K40
    _prefill_only_not_fp4(cfg)  # K41
    _prefill_only_not_mxfp8(cfg)  # K42
    # Structural preconditions of the FA backend's fa_skip_kv_cache path, the only
    # embedding path that neither reads nor writes the pool.
    _prefill_only_needs_unchunked_prefill(cfg)  # K43
    _prefill_only_needs_no_radix_cache(cfg)  # K44
    _prefill_only_not_attn_cp(resolved_view(server_args))  # K45 (the resolved size)
    _prefill_only_not_prefill_cp(cfg)  # K46
    _prefill_only_not_hisparse(cfg)  # K47


def _prefill_only_needs_embedding(cfg: Any) -> None:  # K40
    if not cfg.is_embedding:
        raise ValueError(
            "--prefill-only-disable-kv-cache currently requires --is-embedding. Other prefill-only workloads may "
            "be supported in a future change once their attention paths stop reading or writing the paged KV "
            "cache."
        )


def _prefill_only_not_fp4(cfg: Any) -> None:  # K41
    if cfg.kv_cache_dtype in FP4_KV_DTYPES:
        raise ValueError(
            "--prefill-only-disable-kv-cache does not currently support --kv-cache-dtype=nvfp4 or "
            f"--kv-cache-dtype=fp4_mx_block16 (got {cfg.kv_cache_dtype}) because the FP4 pool uses a separate "
            "allocation path."
        )


def _prefill_only_not_mxfp8(cfg: Any) -> None:  # K42
    if cfg.kv_cache_dtype == "mxfp8":
        raise ValueError(
            "--prefill-only-disable-kv-cache does not currently support --kv-cache-dtype=mxfp8 because the MXFP8 "
            "pool stores separate scale-factor buffers."
        )


def _prefill_only_needs_unchunked_prefill(cfg: Any) -> None:  # K43
    if cfg.chunked_prefill_size != -1:
        raise ValueError(
            "--prefill-only-disable-kv-cache requires --chunked-prefill-size=-1 so the FA backend takes the "
            "fa_skip_kv_cache path; otherwise the pool would be touched between prefill chunks (got "
            f"--chunked-prefill-size {cfg.chunked_prefill_size})."
        )


def _prefill_only_needs_no_radix_cache(cfg: Any) -> None:  # K44
    if not cfg.disable_radix_cache:
        raise ValueError(
            "--prefill-only-disable-kv-cache requires --disable-radix-cache because the radix cache indexes KV "
            "pool slots that no longer hold real data."
        )


def _prefill_only_not_attn_cp(view: Any) -> None:  # K45
    if view.attn_cp_size > 1:
        raise ValueError(
            f"--prefill-only-disable-kv-cache is incompatible with --attn-cp-size > 1 (got {view.attn_cp_size}): "
            "the context-parallel attention path writes K/V to the pool, which the no-op pool rejects."
        )


def _prefill_only_not_prefill_cp(cfg: Any) -> None:  # K46
    if cfg.enable_prefill_cp:
        raise ValueError(
            "--prefill-only-disable-kv-cache is incompatible with --enable-prefill-cp: the prefill-CP path stages "
            "K/V through the paged cache, which the no-op pool does not support."
        )


def _prefill_only_not_hisparse(cfg: Any) -> None:  # K47
    if cfg.enable_hisparse:
        raise ValueError(
            "--prefill-only-disable-kv-cache is incompatible with --enable-hisparse: HiSparse uses a dedicated "
            "pool family that is not the no-op MHA pool."
        )


# =============================================================================
# Run order
# =============================================================================
# check_server_args runs these after the attention-backend default (impl.args.check).
# The order is SGLang 0.5.23's pipeline order (srt/arg_groups/pipeline.py):
# * validate_prefill_only_disable_kv_cache_args runs there early, before the
#   attention backends resolve; it reads only user settings and attn_cp_size
#   (nothing here resolves), so running it first in this list is equivalent;
# * handle_kv4_compatibility, then handle_mxfp8_kv_cache_compatibility (they
#   apply to disjoint dtypes), after the attention backend is resolved;
# * handle_prefill_only_disable_kv_cache after backends settle (K9);
# * handle_cache_compatibility, handle_page_major_kv_layout, then
#   handle_unified_memory_pool, at the end of the pipeline.
KV_CACHE_HOOKS: list[Callable[[Any], None]] = [
    validate_prefill_only_disable_kv_cache_args,
    handle_kv4_compatibility,
    handle_mxfp8_kv_cache_compatibility,
    handle_prefill_only_disable_kv_cache,
    handle_cache_compatibility,
    handle_page_major_kv_layout,
    handle_unified_memory_pool,
]
