"""Mutants of the quantized weights (issue 32)."""

from __future__ import annotations

import torch

from contracts.mutants import mutant
from contracts.mutants.patching import PatchedSubject


@mutant("QUANT-PARITY")
class ActivationScalePerBatch(PatchedSubject):
    """W8A8 quantizes a forward's activations with one scale per batch (its largest |x|) instead of one per
    token: a row's result depends on the rows beside it, and fast prefill changes those rows for the
    cross-decoder. (The quantized layers run the model's reference forward, whose linears read the torch
    reference's ``quantize_rows``.)"""

    def patches(self):
        from impl.kernels import cpu_fused
        from impl.kernels.cpu_fused.transform import FusedLayerForward

        orig = FusedLayerForward.__call__

        def reference_forward(self, h, cos, sin, ple, fb, rows=None):
            if not cpu_fused.is_quantized(self.f.qkv_proj):
                return orig(self, h, cos, sin, ple, fb, rows)
            return type(self.layer).forward(self.layer, h, cos, sin, ple, fb, rows)

        def per_batch(x):
            xf = x.float()
            s = xf.abs().amax() / 127.0
            q = torch.round(xf / s).clamp_(-127, 127) if float(s) > 0 else torch.zeros_like(xf)
            return q.to(torch.int8), s.expand(xf.shape[0]).clone()

        return {"impl.kernels.cpu_fused.transform:FusedLayerForward.__call__": reference_forward,
                "impl.quant.reference:quantize_rows": per_batch}
