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
    """The compiled split-KV decode kernel (the YOCO back half's one-row requests) ignores the K scale.

    (A dropped V scale would be invisible: it scales a layer's attention output uniformly, and Gemma-4's
    post-attention RMSNorm removes any uniform scale.)"""

    def patches(self):
        orig = original("impl.kernels.cpu_attn", "decode_attention_fwd")

        def decode(*args, **kwargs):
            args = list(args)
            if len(args) > 12:
                args[12] = 1.0
            kwargs.pop("k_scale", None)
            return orig(*args, **kwargs)

        return {"impl.kernels.cpu_attn:decode_attention_fwd": decode}
