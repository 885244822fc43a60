"""Mutants of the KV memory (issue 25): fp8 KV caches and the hybrid sliding-window pool.

Each patches one function looked up at call time or at engine build (the mutant tests build their
engines inside the patch: ``spec/test_mutants.py`` runs them in private engines).
"""

from __future__ import annotations

from contracts.mutants import mutant
from contracts.mutants.patching import PatchedSubject, original


# ---- fp8 KV ------------------------------------------------------------------------------
@mutant("KV-FP8-GREEDY-AGREEMENT")
class Fp8ReadIgnoresScale(PatchedSubject):
    """Attention reads fp8 K/V with scale 1.0 whatever the scale file says (written value / scale)."""

    PATCHES = {"impl.cache.kv_pool:TokenToKVPool.get_kv_scales": lambda self, kv_layer_id: (1.0, 1.0)}


@mutant("KV-FP8-GREEDY-AGREEMENT")
class Fp8WriteIgnoresScale(PatchedSubject):
    """The pool writes K/V into fp8 unscaled but the kernels still multiply by the layer's scale."""

    def patches(self):
        orig = original("impl.cache.kv_pool", "quantize")
        return {"impl.cache.kv_pool:quantize": lambda x, scale, dtype: orig(x, 1.0, dtype)}


@mutant("KV-FP8-YOCO-PARITY")
class Fp8DecodeKernelDropsKScale(PatchedSubject):
    """The compiled split-KV decode kernel (the YOCO back half's one-row requests) ignores the K scale, in the checked
    launch and in the launches the triton backend prepares once a pass (``cpu_attn.DecodeLaunch``).

    (A dropped V scale would be invisible: it scales a layer's attention output uniformly, and Gemma-4's
    post-attention RMSNorm removes any uniform scale.)"""

    def patches(self):
        orig = original("impl.kernels.cpu_attn", "decode_attention_fwd")
        orig_launch = original("impl.kernels.cpu_attn", "DecodeLaunch")

        def unscaled(args, kwargs):
            args = list(args)
            if len(args) > 12:
                args[12] = 1.0
            kwargs.pop("k_scale", None)
            return args, kwargs

        def decode(*args, **kwargs):
            args, kwargs = unscaled(args, kwargs)
            return orig(*args, **kwargs)

        class Launch(orig_launch):
            def __init__(self, *args, **kwargs):
                args, kwargs = unscaled(args, kwargs)
                super().__init__(*args, **kwargs)

        return {"impl.kernels.cpu_attn:decode_attention_fwd": decode, "impl.kernels.cpu_attn:DecodeLaunch": Launch}


# ---- the hybrid sliding-window pool -----------------------------------------------------------
@mutant("KV-SWA-POOL-BUDGETS", "KV-SWA-LONGER-CONTEXT")
class SwaRatioIgnored(PatchedSubject):
    """--swa-full-tokens-ratio validates and changes nothing: both pools get the one-pool token count."""

    def patches(self):
        orig = original("impl.engine.model_runner", "hybrid_budget")
        return {"impl.engine.model_runner:hybrid_budget": lambda n, fb, sb, ratio, **kw: orig(n, fb, sb, 1.0, **kw)}


@mutant("KV-SWA-POOL-BUDGETS")
class HybridPoolNeverBuilt(PatchedSubject):
    """The hybrid pool exists but is never the default: every model keeps one pool."""

    PATCHES = {"impl.engine.model_runner:hybrid_applies": lambda model_config, disable: False}


@mutant("KV-SWA-OUTPUTS-AND-INTEGRITY")
class SwaFreesInsideWindow(PatchedSubject):
    """A request gives back the sliding-window slot of a token still inside its window (one too many)."""

    def patches(self):
        orig = original("impl.engine.kv_pools", "HybridSWAPool.window_start")
        return {"impl.engine.kv_pools:HybridSWAPool.window_start": lambda self, req: orig(self, req) + 1}


@mutant("KV-SWA-OUTPUTS-AND-INTEGRITY")
class SwaRadixIgnoresTombstones(PatchedSubject):
    """The radix cache matches cached prefixes whose window was freed as if they were whole."""

    PATCHES = {"impl.cache.swa_radix_cache:SWARadixCache._valid": lambda self, m, run: True}


@mutant("KV-SWA-SPECULATIVE")
class SwaRejectedDraftsKeepSwa(PatchedSubject):
    """Rejected draft rows give back their full-attention slots only: their sliding-window slots leak."""

    def patches(self):
        def trim(self, req, kv_len):
            if req.req_pool_idx is None or kv_len >= req.kv_len:
                return
            rows = self.req_to_token_pool.req_to_token[req.req_pool_idx, kv_len : req.kv_len].cpu()
            (self.allocator.full if self.hybrid else self.allocator).free(rows)
            req.kv_len = kv_len

        return {"impl.engine.kv_lifecycle:KVLifecycle.trim": trim}


@mutant("KV-SWA-OUTPUTS-AND-INTEGRITY")
class SwaWindowFromKvLen(PatchedSubject):
    """A request's window is taken from where its KV ends, not from where the forward being built starts
    querying: a prefill (or chunk) frees the sliding-window KV its own first queries read."""

    def patches(self):
        def window_start(self, req):
            last = req.kv_len - 1 if req.kv_len > req.prefix_len else req.kv_len
            return max(0, last - self.window + 1)

        return {"impl.engine.kv_pools:HybridSWAPool.window_start": window_start}


@mutant("KV-SWA-OUTPUTS-AND-INTEGRITY")
class SwaPreemptionLeaksWindow(PatchedSubject):
    """A preempted (retracted) request gives back its full-attention slots and drops its sliding-window
    pairings without returning those slots to the sliding-window free list."""

    def patches(self):
        orig = original("impl.engine.decode_schedule", "DecodeSchedule.retract")

        def retract(self, req):
            alloc = self.kv.allocator
            if not self.kv.hybrid:
                return orig(self, req)

            def forget(slots):
                alloc.full_to_swa[slots.to(alloc.device).long().flatten()] = 0

            alloc.free_swa = forget  # an instance attribute shadows the method for this call only
            try:
                return orig(self, req)
            finally:
                del alloc.free_swa

        return {"impl.engine.decode_schedule:DecodeSchedule.retract": retract}


# ---- the request cap (SGLang's SWARequestCapPoolConfigurator) --------------------------------------------
@mutant("KV-SWA-REQUEST-CAP-SIZING")
class SwaCapForgetsChunk(PatchedSubject):
    """The request cap leaves out the prefill chunk in flight: the sliding-window pool is a chunk short of what
    the admitted requests may hold at once."""

    PATCHES = {"impl.cache.swa_request_cap:SWARequestCap.chunk_tokens": property(lambda self: self.page_size)}


@mutant("KV-SWA-REQUEST-CAP-SIZING")
class SwaCapNeverChosen(PatchedSubject):
    """--max-running-requests with the radix cache off and chunked prefill still sizes the pool by the ratio."""

    def patches(self):
        orig = original("impl.engine.model_runner", "choose_swa_sizing")
        return {"impl.engine.model_runner:choose_swa_sizing": lambda args, window, chunk: orig(args, window, -1)}


@mutant("KV-SWA-REQUEST-CAP-HOLDS")
class SwaNoEagerEviction(PatchedSubject):
    """Without the radix cache a request keeps the sliding-window KV of tokens that left its window (no
    per-chunk or per-interval free): under the request cap it outgrows its cap and the pool runs short."""

    PATCHES = {"impl.engine.kv_pools:HybridSWAPool.maybe_evict_swa": lambda self, req: None}
