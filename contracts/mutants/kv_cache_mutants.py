"""Mutants of the seed-004 KV-cache rules (K1-K47) and of the launch-time refusal.

Almost all are PatchedSubjects that break the real rule inside ``impl.args.kv_cache``:
a rule helper becomes a no-op or a weaker check, or an allow-list takes SGLang
0.5.23's (different) values. A few break the hook order or the view a hook reads.
"""

from __future__ import annotations

from typing import Any, Callable

from contracts.mutants import mutant
from contracts.mutants.patching import OutcomeMutant, PatchedSubject

KV = "impl.args.kv_cache"


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class KvPatched(PatchedSubject):
    """Patches ``impl.args.kv_cache`` attributes: ``NOOP`` helpers become no-ops, ``SET`` replaces values
    (a ``"module:attribute"`` key patches another module), ``HOOKS`` replaces whole hooks (inside
    KV_CACHE_HOOKS too). Most mutants are rows of ``TABLE`` at the end of this file."""

    NOOP: tuple[str, ...] = ()
    SET: dict[str, Any] = {}
    HOOKS: dict[str, Callable[[Any], None]] = {}

    def patches(self) -> dict[str, Any]:
        out = dict(self.PATCHES)
        out.update({f"{KV}:{name}": _noop for name in self.NOOP})
        out.update({name if ":" in name else f"{KV}:{name}": value for name, value in self.SET.items()})
        if self.HOOKS:
            import importlib

            kv = importlib.import_module(KV)
            out.update({f"{KV}:{name}": fn for name, fn in self.HOOKS.items()})
            out[f"{KV}:KV_CACHE_HOOKS"] = [self.HOOKS.get(h.__name__, h) for h in kv.KV_CACHE_HOOKS]
        return out

    def refuse(self, argv, platform="cpu"):
        with self._ctx():
            return self.inner.refuse(argv, platform)


# ---- K1-K8: MXFP8 and KV4 ------------------------------------------------------------------------------
def _mxfp8_needs_cuda(server_args):
    from impl.args.resolution import platform_of

    if not platform_of(server_args).is_cuda:
        raise ValueError("--kv-cache-dtype mxfp8 requires a Blackwell GPU")


def _nvfp4_sm100_only(server_args, dtype):
    from impl.args.resolution import platform_of

    if dtype == "nvfp4" and not platform_of(server_args).is_sm100:
        raise RuntimeError("--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120; use fp4_mx_block16")


def _warn_always(server_args):
    import logging

    from impl.args.resolution import (
        attention_backends_of,
        resolved_view,
        resolving_view,
    )

    if resolving_view(server_args).kv_cache_dtype in ("nvfp4", "fp4_mx_block16"):
        p, d = attention_backends_of(resolved_view(server_args))
        logging.getLogger("impl.args").warning("Attention: Using KV4 with PREFILL = %s and DECODE = %s.", p, d)


@mutant("KV4-MIXED-BACKENDS-WARN")
class Kv4WarnsAlways(KvPatched):
    """The KV4 mixed-backend warning is logged for every KV4 configuration, matching backends included."""

    def patches(self):
        from impl.args import attention

        original = attention.handle_attention_backend_default

        def default_then_warn(server_args):
            original(server_args)
            _warn_always(server_args)

        return {"impl.args.attention:handle_attention_backend_default": default_then_warn}


# ---- K9, K10, K40-K47: prefill-only ---------------------------------------------------------------------
def _kv_hooks_before_backend_default():
    from impl.args import attention, kv_cache, kv_sharing, speculative

    return [
        speculative.handle_speculative_algorithm,
        kv_sharing.handle_kv_sharing_fast_prefill_backend,
        *kv_cache.KV_CACHE_HOOKS,
        attention.handle_attention_backend_default,
        kv_sharing.validate_kv_sharing_fast_prefill,
    ]


@mutant("PREFILL-ONLY-AFTER-BACKEND-RESOLUTION")
class KvHooksBeforeBackendDefault(PatchedSubject):
    """The KV-cache hooks run before the attention-backend default is resolved (call-site reordering)."""

    PATCHES = {"impl.args.check:hooks": _kv_hooks_before_backend_default}


def _prefill_only_reads_user_backend(server_args):
    from impl.args.resolution import attention_backends_of, resolving_view

    cfg = resolving_view(server_args)
    if not cfg.prefill_only_disable_kv_cache:
        return
    prefill, _ = attention_backends_of(cfg)
    if prefill is not None and prefill not in ("fa3", "fa4"):
        raise ValueError(f"--prefill-only-disable-kv-cache requires fa3/fa4, got prefill backend {prefill!r}")


@mutant("PREFILL-ONLY-AFTER-BACKEND-RESOLUTION")
class PrefillOnlyReadsUserBackend(KvPatched):
    """The backend rule reads the user's (unresolved) backends: an unset backend escapes it."""

    HOOKS = {"handle_prefill_only_disable_kv_cache": _prefill_only_reads_user_backend}


def _chunk_unset_ok(cfg):
    if cfg.chunked_prefill_size not in (-1, None):
        raise ValueError("--prefill-only-disable-kv-cache requires --chunked-prefill-size=-1")


def _attn_cp_above_two(view):
    if view.attn_cp_size > 2:
        raise ValueError("--prefill-only-disable-kv-cache is incompatible with --attn-cp-size > 1")


# ---- K11-K18: cache compatibility -----------------------------------------------------------------------
def _host_pool_not_null(cfg):
    if cfg.disaggregation_decode_retraction_backup == "host_pool" and cfg.disaggregation_mode == "null":
        raise ValueError("--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server.")


def _host_pool_priority_ignores_preemption_flag(cfg):
    if cfg.disaggregation_decode_retraction_backup == "host_pool" and cfg.enable_priority_scheduling:
        raise ValueError("--disaggregation-decode-retraction-backup=host_pool requires --disable-priority-preemption")


def _ratio_allows_zero(ratio):
    if not (0 <= ratio <= 1.0):
        raise ValueError("--swa-full-tokens-ratio should be in range (0, 1.0].")


def _ratio_excludes_one(ratio):
    if not (0 < ratio < 1.0):
        raise ValueError("--swa-full-tokens-ratio should be in range (0, 1.0].")


@mutant("UM-DSPARK-TOPK")
class UnifiedTopkAlways(KvPatched):
    """SGLang 0.5.23's behaviour: the top-k rule applies without DSPARK too."""

    def patches(self):
        from impl.args import kv_cache
        from impl.args.resolution import resolving_view

        original = kv_cache.handle_unified_memory_pool

        def topk_for_every_algorithm(server_args):
            cfg = resolving_view(server_args)
            if cfg.enable_unified_memory and cfg.speculative_eagle_topk not in (None, 1):
                raise ValueError("--enable-unified-memory supports --speculative-eagle-topk in {None, 1} only")
            original(server_args)

        self.HOOKS = {"handle_unified_memory_pool": topk_for_every_algorithm}
        return super().patches()


def _dspark_decode_only(server_args):
    from impl.args import kv_cache
    from impl.args.resolution import attention_backends_of, resolved_view

    _, decode = attention_backends_of(resolved_view(server_args))
    if decode not in kv_cache.UNIFIED_DSPARK_BACKENDS:
        raise ValueError(f"--enable-unified-memory + DSPARK: backend {decode} is not audited")


def _lmcache_only(cfg):
    if cfg.enable_lmcache:
        raise ValueError("--enable-unified-memory is not yet compatible with --enable-lmcache")


def _prefill_graph_always_refused(server_args, cfg):
    from impl.args import kv_cache

    if kv_cache.prefill_cuda_graph_backend(server_args) != "disabled":
        raise ValueError("--enable-unified-memory supports decode cuda-graph capture only; pass --cuda-graph-backend-prefill=disabled")


def _prefill_graph_silent(server_args, cfg):
    from impl.args import kv_cache
    from impl.args.resolution import declare_resolution

    if kv_cache.prefill_cuda_graph_backend(server_args) == "disabled":
        return
    if cfg.cuda_graph_backend_prefill is not None:
        raise ValueError("--enable-unified-memory: pass --cuda-graph-backend-prefill=disabled")
    declare_resolution(server_args, "handle_unified_memory_pool", cuda_graph_backend_prefill="disabled")


def _page_major_guard_on_user_view(server_args):
    from impl.args import kv_cache
    from impl.args.resolution import resolving_view

    cfg = resolving_view(server_args)
    if cfg.enable_unified_memory:
        kv_cache._declare_page_major_for_unified(server_args)
    if not cfg.enable_page_major_kv_layout:  # the user's value: the declaration above is not seen
        return
    kv_cache._page_major_needs_unified(cfg)
    kv_cache._unified_needs_uniform_kv_rows(server_args)
    kv_cache._page_major_attention_backends(server_args, cfg)
    kv_cache._page_major_linear_attn_backends(server_args, cfg)
    kv_cache._page_major_mamba_backend(cfg)


@mutant("UM-IMPLIES-PAGE-MAJOR", "PAGE-MAJOR-BACKENDS", "UM-UNIFORM-KV-ROWS", "PAGE-MAJOR-LINEAR-DECODE",
        "PAGE-MAJOR-LINEAR-PREFILL", "PAGE-MAJOR-MAMBA")
class PageMajorGuardOnUserView(KvPatched):
    """The page-major guard reads the user's value, so a bare --enable-unified-memory skips every page-major check."""

    HOOKS = {"handle_page_major_kv_layout": _page_major_guard_on_user_view}


def _raw_dims(mc):
    return mc.head_dim, mc.v_head_dim, mc.swa_head_dim, mc.swa_v_head_dim


def _asymmetric(mc) -> bool:
    from impl.args import kv_cache

    return kv_cache.has_asymmetric_kv(mc)


@mutant("PAGE-MAJOR-LINEAR-DECODE", "PAGE-MAJOR-LINEAR-PREFILL")
class LinearMlaExtrasForAll(KvPatched):
    """cutedsl / helion are allowed for MHA models too (not only KDA-hybrid MLA models)."""

    def patches(self):
        from impl.args import kv_cache

        return {f"{KV}:_linear_attn_allowed": lambda server_args, base: base | kv_cache.LINEAR_MLA_EXTRA_BACKENDS}


# ---- messages ----------------------------------------------------------------------------------------------
@mutant(
    "KV-MXFP8-BLACKWELL", "KV-NVFP4-SM100-SM120", "KV4-FA4-MLA-DECODE", "KV4-FA4-MHA-DECODE", "KV4-MLA-BACKEND",
    "KV4-MHA-BACKEND", "KV4-NON-CUDA", "PREFILL-ONLY-AFTER-BACKEND-RESOLUTION", "PREFILL-ONLY-FA-BACKEND",
    "PREFILL-ONLY-NEEDS-EMBEDDING", "PREFILL-ONLY-NO-FP4-KV", "PREFILL-ONLY-NO-MXFP8-KV", "PREFILL-ONLY-NO-CHUNKING",
    "PREFILL-ONLY-NO-RADIX-CACHE", "PREFILL-ONLY-NO-ATTN-CP", "PREFILL-ONLY-NO-PREFILL-CP", "PREFILL-ONLY-NO-HISPARSE",
    "HOST-POOL-PD-DECODE-ONLY", "HOST-POOL-NO-DCP", "HOST-POOL-PRIORITY-PREEMPTION", "HICACHE-VS-NO-RADIX",
    "DECODE-OFFLOAD-DECODE-SIDE", "DECODE-OFFLOAD-NEEDS-STORAGE", "DECODE-OFFLOAD-VS-HOST-POOL", "SWA-RATIO-RANGE",
    "UM-PD-MOONCAKE", "UM-PD-NO-PP", "UM-PD-LAZY-COMPACTION", "UM-PD-NO-HISPARSE", "UM-SPEC-ALGORITHM",
    "UM-DSPARK-TOPK", "UM-DSPARK-BACKENDS", "UM-NO-HOST-TIERED-CACHE", "UM-DCP-GATE", "UM-PREFILL-CUDA-GRAPH",
    "UM-DCP-MLA-ONLY", "UM-DCP-NO-HYBRID-SWA", "UM-DCP-NO-PD", "UM-DCP-BACKENDS", "UM-IMPLIES-PAGE-MAJOR",
    "PAGE-MAJOR-NEEDS-UM", "UM-UNIFORM-KV-ROWS", "PAGE-MAJOR-BACKENDS", "PAGE-MAJOR-LINEAR-DECODE",
    "PAGE-MAJOR-LINEAR-PREFILL", "PAGE-MAJOR-MAMBA",
)
class KvVagueErrors(OutcomeMutant):
    """KV-cache rejections keep their type but name no flag ('invalid KV-cache settings')."""

    def mutate(self, argv, out):
        if out.error is not None:
            out.error = type(out.error)("invalid KV-cache settings")
        return out


# ---- launch-time refusal -------------------------------------------------------------------------------------
def _refuse_first_only(server_args):
    from impl.args import unsupported

    found = unsupported.unimplemented_settings(server_args)
    if found:
        feature, flags = found[0]
        raise ValueError(f"this engine does not implement {feature}: {', '.join(flags)}")


@mutant("IMPL-REFUSES-UNIMPLEMENTED")
class IgnoresSpeculative(KvPatched):
    """Speculative settings are silently ignored at launch."""

    def patches(self):
        from impl.args import unsupported

        kept = [u for u in unsupported.UNIMPLEMENTED if not u.feature.startswith("speculative")]
        return {"impl.args.unsupported:UNIMPLEMENTED": kept}


# ---- the table: (mutant, contracts it kills, what breaks, patch) -----------------------------------------------
# patch: the name of an impl.args.kv_cache helper that becomes a no-op, or {attribute: replacement}
# (attribute names are in impl.args.kv_cache unless they name their module as "module:attribute").
TABLE: list[tuple[str, str | tuple[str, ...], str, str | dict[str, Any]]] = [
    ("Mxfp8AnyCuda", "KV-MXFP8-BLACKWELL", "mxfp8 is accepted on any CUDA GPU (Hopper, Ampere), not only Blackwell.", {"_mxfp8_needs_blackwell": _mxfp8_needs_cuda}),
    ("Mxfp8Unchecked", "KV-MXFP8-BLACKWELL", "The mxfp8 platform rule is gone.", "_mxfp8_needs_blackwell"),
    ("Nvfp4Sm100Only", "KV-NVFP4-SM100-SM120", "nvfp4 is refused on SM120 too.", {"_nvfp4_needs_sm100_or_sm120": _nvfp4_sm100_only}),
    ("Nvfp4AnyCuda", "KV-NVFP4-SM100-SM120", "nvfp4 is accepted on Hopper and Ampere.", "_nvfp4_needs_sm100_or_sm120"),
    ("Kv4MixedSilent", "KV4-MIXED-BACKENDS-WARN", "Mixed KV4 prefill/decode backends give no warning.", "_warn_kv4_mixed_backends"),
    ("Kv4Fa4MlaList0523", "KV4-FA4-MLA-DECODE", "SGLang 0.5.23's FA4 + MLA decode list (cutlass_mla dropped).", {"KV4_FA4_MLA_DECODE_BACKENDS": ("flashinfer", "trtllm_mla")}),
    ("Kv4Fa4MlaUnchecked", "KV4-FA4-MLA-DECODE", "Any decode backend is accepted with fa4 prefill on MLA.", "_kv4_fa4_mla_decode"),
    ("Kv4Fa4MhaAllowsFlashinfer", "KV4-FA4-MHA-DECODE", "flashinfer joins the FA4 + MHA decode list.", {"KV4_FA4_MHA_DECODE_BACKENDS": ("triton", "torch_native", "flex_attention", "flashinfer")}),
    ("Kv4MlaList0523", "KV4-MLA-BACKEND", "SGLang 0.5.23's KV4 MLA list (cutlass_mla dropped).", {"KV4_MLA_ATTENTION_BACKENDS": ("flashinfer", "trtllm_mla")}),
    ("Kv4MlaUnchecked", "KV4-MLA-BACKEND", "Any attention backend is accepted for KV4 on MLA.", "_kv4_mla_attention"),
    ("Kv4MhaNoTrtllm", "KV4-MHA-BACKEND", "trtllm_mha is missing from the KV4 MHA list.", {"KV4_MHA_ATTENTION_BACKENDS": ("triton", "torch_native", "flex_attention")}),
    ("Kv4MhaUnchecked", "KV4-MHA-BACKEND", "Any attention backend is accepted for KV4 on MHA.", "_kv4_mha_attention"),
    ("Kv4OnCpu", "KV4-NON-CUDA", "KV4 is accepted off CUDA.", "_kv4_not_on_non_cuda"),
    ("PrefillOnlyAllowsTriton", "PREFILL-ONLY-FA-BACKEND", "triton joins the prefill-only backends.", {"PREFILL_ONLY_PREFILL_BACKENDS": ("fa3", "fa4", "triton")}),
    ("PrefillOnlyNoEmbedding", "PREFILL-ONLY-NEEDS-EMBEDDING", "--is-embedding is not required.", "_prefill_only_needs_embedding"),
    ("PrefillOnlyFp4", "PREFILL-ONLY-NO-FP4-KV", "FP4 KV is accepted with prefill-only.", "_prefill_only_not_fp4"),
    ("PrefillOnlyMxfp8", "PREFILL-ONLY-NO-MXFP8-KV", "MXFP8 KV is accepted with prefill-only.", "_prefill_only_not_mxfp8"),
    ("PrefillOnlyChunkUnsetOk", "PREFILL-ONLY-NO-CHUNKING", "An unset --chunked-prefill-size passes (only explicit sizes are refused).", {"_prefill_only_needs_unchunked_prefill": _chunk_unset_ok}),
    ("PrefillOnlyRadix", "PREFILL-ONLY-NO-RADIX-CACHE", "The radix cache may stay on.", "_prefill_only_needs_no_radix_cache"),
    ("PrefillOnlyAttnCpOffByOne", "PREFILL-ONLY-NO-ATTN-CP", "--attn-cp-size 2 slips through (off by one).", {"_prefill_only_not_attn_cp": _attn_cp_above_two}),
    ("PrefillOnlyPrefillCp", "PREFILL-ONLY-NO-PREFILL-CP", "--enable-prefill-cp is accepted with prefill-only.", "_prefill_only_not_prefill_cp"),
    ("PrefillOnlyHisparse", "PREFILL-ONLY-NO-HISPARSE", "--enable-hisparse is accepted with prefill-only.", "_prefill_only_not_hisparse"),
    ("HostPoolOnPrefill", "HOST-POOL-PD-DECODE-ONLY", "host_pool is accepted on a PD prefill server (only the non-PD case is refused).", {"_host_pool_needs_pd_decode": _host_pool_not_null}),
    ("HostPoolWithDcp", "HOST-POOL-NO-DCP", "host_pool is accepted with --dcp-size > 1.", "_host_pool_without_dcp"),
    ("HostPoolPriorityAlways", "HOST-POOL-PRIORITY-PREEMPTION", "host_pool + priority scheduling is refused even with --disable-priority-preemption.", {"_host_pool_priority_needs_no_preemption": _host_pool_priority_ignores_preemption_flag}),
    ("HostPoolPriorityUnchecked", "HOST-POOL-PRIORITY-PREEMPTION", "host_pool + priority preemption is accepted.", "_host_pool_priority_needs_no_preemption"),
    ("HicacheWithoutRadix", "HICACHE-VS-NO-RADIX", "Hierarchical cache is accepted with the radix cache disabled.", "_hierarchical_cache_needs_radix"),
    ("DecodeOffloadAnySide", "DECODE-OFFLOAD-DECODE-SIDE", "Decode KV offload is accepted off the decode side.", "_decode_offload_on_decode_side"),
    ("DecodeOffloadNoStorage", "DECODE-OFFLOAD-NEEDS-STORAGE", "Decode KV offload is accepted without a storage backend.", "_decode_offload_needs_storage"),
    ("DecodeOffloadWithHostPool", "DECODE-OFFLOAD-VS-HOST-POOL", "Decode KV offload and host_pool are accepted together.", "_decode_offload_not_with_host_pool"),
    ("SwaRatioAllowsZero", "SWA-RATIO-RANGE", "--swa-full-tokens-ratio 0 is accepted.", {"_swa_full_tokens_ratio_in_range": _ratio_allows_zero}),
    ("SwaRatioExcludesOne", "SWA-RATIO-RANGE", "--swa-full-tokens-ratio 1.0 is refused.", {"_swa_full_tokens_ratio_in_range": _ratio_excludes_one}),
    ("UnifiedPdAnyTransfer", "UM-PD-MOONCAKE", "Unified memory + PD accepts every transfer backend but fake / mooncake_tcp.", {"UNIFIED_PD_TRANSFER_BACKENDS": ("mooncake", "nixl")}),
    ("UnifiedPdWithPp", "UM-PD-NO-PP", "Unified memory + PD accepts pipeline parallelism.", "_unified_pd_no_pipeline_parallel"),
    ("UnifiedPdIgnoresLazyCompactionEnv", "UM-PD-LAZY-COMPACTION", "The lazy-compaction environment switch is ignored.", "_unified_pd_lazy_compaction"),
    ("UnifiedPdHisparse", "UM-PD-NO-HISPARSE", "Unified memory + PD accepts HiSparse.", "_unified_pd_no_hisparse"),
    ("UnifiedSpec0523", "UM-SPEC-ALGORITHM", "SGLang 0.5.23's speculative list for unified memory (EAGLE, EAGLE3, DFLASH added).", {"UNIFIED_SPECULATIVE_ALGORITHMS": (None, "DSPARK", "EAGLE", "EAGLE3", "DFLASH")}),
    ("UnifiedDsparkTree", "UM-DSPARK-TOPK", "DSPARK tree drafts (top-k > 1) are accepted.", "_unified_dspark_topk"),
    ("UnifiedDsparkBackends0523", "UM-DSPARK-BACKENDS", "SGLang 0.5.23's DSPARK backend set (fa3/fa4/flashinfer/flashmla in, tokenspeed_mla out).", {"UNIFIED_DSPARK_BACKENDS": frozenset({"triton", "trtllm_mla", "cutedsl_mla", "flashmla", "flashinfer", "fa3", "fa4"})}),
    ("UnifiedDsparkDecodeOnly", "UM-DSPARK-BACKENDS", "Only the decode backend is checked for DSPARK.", {"_unified_dspark_backends": _dspark_decode_only}),
    ("UnifiedWithHicache", "UM-NO-HOST-TIERED-CACHE", "Unified memory accepts the hierarchical cache (only LMCache is refused, as in SGLang 0.5.23).", {"_unified_no_host_tiered_cache": _lmcache_only}),
    ("UnifiedDcpUnchecked", ("UM-DCP-GATE", "UM-DCP-MLA-ONLY"), "The unified-memory DCP checks never run.", "_validate_unified_memory_dcp"),
    ("UnifiedPrefillGraphIgnored", "UM-PREFILL-CUDA-GRAPH", "Prefill cuda-graph capture is neither refused nor disabled under unified memory.", "_unified_prefill_cuda_graph"),
    ("UnifiedPrefillGraphRefusedByDefault", "UM-PREFILL-CUDA-GRAPH", "The default prefill capture is refused instead of disabled with a warning.", {"_unified_prefill_cuda_graph": _prefill_graph_always_refused}),
    ("UnifiedPrefillGraphSilent", "UM-PREFILL-CUDA-GRAPH", "Prefill capture is disabled without the warning.", {"_unified_prefill_cuda_graph": _prefill_graph_silent}),
    ("UnifiedDcpHybridSwa", "UM-DCP-NO-HYBRID-SWA", "Unified memory + DCP accepts hybrid sliding-window models.", "_unified_dcp_no_hybrid_swa"),
    ("UnifiedDcpMha", "UM-DCP-MLA-ONLY", "Unified memory + DCP accepts MHA models.", "_unified_dcp_mla_only"),
    ("UnifiedDcpPd", "UM-DCP-NO-PD", "Unified memory + DCP accepts PD disaggregation.", "_unified_dcp_no_pd"),
    ("UnifiedDcpBackends0523", "UM-DCP-BACKENDS", "SGLang 0.5.23's DCP backend set (tokenspeed_mla dropped).", {"UNIFIED_DCP_BACKENDS": frozenset({"flashinfer", "trtllm_mla", "cutedsl_mla"})}),
    ("UnifiedDcpAnyBackend", "UM-DCP-BACKENDS", "Unified memory + DCP accepts any backend.", "_unified_dcp_backends"),
    ("UnifiedNoPageMajor", "UM-IMPLIES-PAGE-MAJOR", "Unified memory does not declare the page-major layout.", "_declare_page_major_for_unified"),
    ("PageMajorWithoutUnified", "PAGE-MAJOR-NEEDS-UM", "Page-major layout is accepted without unified memory.", "_page_major_needs_unified"),
    ("UniformRowsMixesLayerTypes", "UM-UNIFORM-KV-ROWS", "K/V uniformity compares the sliding-window K width with the full-attention V width (refuses Gemma-4).", {"_kv_row_dims": _raw_dims}),
    ("UniformRowsNoMlaExemption", "UM-UNIFORM-KV-ROWS", "MLA models lose their exemption from the uniform-rows rule.", {"unified_memory_supported_for_model": lambda mc, use_mla_backend: not _asymmetric(mc)}),
    ("UniformRowsUnchecked", "UM-UNIFORM-KV-ROWS", "Unified memory accepts asymmetric K/V rows.", "_unified_needs_uniform_kv_rows"),
    ("PageMajorMhaAllowsTorchNative", "PAGE-MAJOR-BACKENDS", "torch_native joins the MHA unified allow-list.", {"PAGE_MAJOR_UNIFIED_MHA_BACKENDS": frozenset({"triton", "fa3", "fa4", "flashinfer", "trtllm_mha", "torch_native"})}),
    ("PageMajorMla0523", "PAGE-MAJOR-BACKENDS", "SGLang 0.5.23's MLA allow-list (tokenspeed_mla dropped).", {"PAGE_MAJOR_UNIFIED_MLA_BACKENDS": frozenset({"triton", "fa3", "trtllm_mla", "flashinfer", "cutedsl_mla", "flashmla"})}),
    ("LinearDecodeAllowsFlashkda", "PAGE-MAJOR-LINEAR-DECODE", "flashkda joins the linear-attention decode list.", {"LINEAR_DECODE_BACKENDS": frozenset({"triton", "flashinfer", "flashkda"})}),
    ("LinearPrefill0523", "PAGE-MAJOR-LINEAR-PREFILL", "SGLang 0.5.23's prefill list (flashinfer added).", {"LINEAR_PREFILL_BACKENDS": frozenset({"triton", "flashkda", "flashinfer"})}),
    ("MambaAllowsFlashinfer", "PAGE-MAJOR-MAMBA", "flashinfer Mamba kernels are accepted with the page-major layout.", {"MAMBA_BACKENDS": (None, "triton", "flashinfer")}),
    ("RefusesFirstOnly", "IMPL-REFUSES-UNIMPLEMENTED", "Only the first unimplemented setting is reported (the operator fixes them one launch at a time).", {"impl.args.unsupported:refuse_unimplemented": _refuse_first_only}),
    ("AcceptsMxfp8Kv", "IMPL-REFUSES-UNIMPLEMENTED", "MXFP8 / FP4 KV dtypes start although no pool stores them (silently ignored).", {"impl.args.unsupported:IMPLEMENTED_KV_CACHE_DTYPES": ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16")}),
    ("RefusesFp8Kv", "IMPL-REFUSES-UNIMPLEMENTED", "fp8 KV is refused although the pool implements it (the pre-issue-25 refusal).", {"impl.args.unsupported:IMPLEMENTED_KV_CACHE_DTYPES": ("auto", "bf16", "bfloat16")}),
    ("RefusesBf16Kv", "IMPL-REFUSES-UNIMPLEMENTED", "bf16 KV is refused although the pool implements it.", {"impl.args.unsupported:IMPLEMENTED_KV_CACHE_DTYPES": ("auto",)}),
]


for _name, _kills, _doc, _patch in TABLE:
    _attrs: dict[str, Any] = {"__doc__": _doc, "__module__": __name__}
    if isinstance(_patch, str):
        _attrs["NOOP"] = (_patch,)
    else:
        _attrs["SET"] = _patch
    globals()[_name] = mutant(*((_kills,) if isinstance(_kills, str) else _kills))(type(_name, (KvPatched,), _attrs))
