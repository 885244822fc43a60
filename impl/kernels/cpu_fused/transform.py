"""CPU fast paths for a loaded Gemma-4 model, applied as a transform (gpt-fast's style: the model file
``impl/model/decoder_layer.py`` holds only the reference forward; this module swaps in faster
forwards on a built model, after its weights are loaded and fused).

Per decoder layer, whichever applies first:

1. ``FusedLayerForward``: the layer as two C++ kernels around the attention backend (``attn_pre``,
   ``decoder_post``; CPU float32 gelu-tanh layers with fused q/k/v and gate/up weights, extension
   built). Same math; float32 rounding may differ in the last bit (see ``__init__``). Their linear
   weights go to oneDNN or ATen's mm as ``linear.py`` plans for the whole model.
2. ``FloatLayerForward``: the same computation in float32 with plain function calls (no nn.Module
   dispatch per op; decode steps are bound by per-op overhead, not FLOPs). Bit-identical to the
   reference forward.
3. The layer's own ``forward`` (MoE layers, non-float32 weights).

The layer is read by duck typing (attribute names of ``Gemma4DecoderLayer``), so this package
imports nothing from ``impl/model`` (``reference.py`` is the documented exception: it is the torch
statement of the kernels, written with the model's RoPE).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from impl.forward_batch import ForwardBatch
from impl.kernels import cpu_fused
from impl.kernels.cpu_fused import linear as cpu_linear
from impl.kernels.functional import GELU_TANH, rms_norm


@dataclass(frozen=True)
class PleWeights:
    """Per-layer-embedding gate of one layer."""

    gate: torch.Tensor  # per_layer_input_gate [P, hidden]
    proj: torch.Tensor  # per_layer_projection [hidden, P]
    norm: torch.Tensor  # post_per_layer_input_norm [hidden]


@dataclass(frozen=True)
class LayerWeights:
    """The float32 constants a fast forward reads: norm weights, the PLE gate, ``layer_scalar`` as
    a Python float (``h * float`` rounds exactly as ``h * tensor([s])``)."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    post_feedforward_norm: torch.Tensor
    ple: PleWeights | None
    scalar: float
    eps: float


@dataclass(frozen=True)
class FusedWeights:
    """The extra arguments of the two fused kernels. Linear weights are plain tensors or, with the
    ``packed`` linear mode, oneDNN-prepacked copies (same sizes)."""

    qkv_proj: torch.Tensor  # [(H + 2 Hkv) * D, hidden] (owning layer) or q_proj [H * D, hidden]
    head_norm: torch.Tensor  # [H + 2 Hkv, D] or [H, D], contiguous
    q_heads: int
    o_proj: torch.Tensor  # [hidden, H * D]
    gate_up: tuple[torch.Tensor, ...]  # (gate_up [2 * I, hidden],) for mm; (gate [I, hidden], up [I, hidden]) for oneDNN
    down: torch.Tensor  # [hidden, I]
    onednn: bool = False  # plain weights through oneDNN (the ``onednn`` linear mode)

    def linear_weights(self) -> list[torch.Tensor]:
        return [self.qkv_proj, self.o_proj, *self.gate_up, self.down]

    def for_linear_mode(self, mode: str) -> "FusedWeights":
        """These weights as the kernels take them in linear mode ``mode`` (``linear.py``)."""
        if mode == "mkl":
            return self
        (gate_up,) = self.gate_up
        i = gate_up.shape[0] // 2
        gate, up = gate_up[:i], gate_up[i:]  # row slices: contiguous views, no copy
        if mode == "onednn":
            return replace(self, gate_up=(gate, up), onednn=True)
        p = cpu_linear.pack
        return replace(self, qkv_proj=p(self.qkv_proj), o_proj=p(self.o_proj), gate_up=(p(gate), p(up)), down=p(self.down))


class FloatLayerForward:
    """The reference forward in float32 with plain function calls."""

    def __init__(self, layer: Any, w: LayerWeights):
        self.layer, self.w = layer, w

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None,
                 fb: ForwardBatch) -> torch.Tensor:
        w, layer = self.w, self.layer
        a = layer.self_attn.forward(rms_norm(h, w.input_norm, w.eps), cos, sin, fb)
        h = h + rms_norm(a, w.post_attention_norm, w.eps)
        m = layer.mlp.forward(rms_norm(h, w.pre_feedforward_norm, w.eps))
        h = h + rms_norm(m, w.post_feedforward_norm, w.eps)
        if w.ple is not None:
            g = layer.act(F.linear(h, w.ple.gate)).mul_(ple)
            h = h + rms_norm(F.linear(g, w.ple.proj), w.ple.norm, w.eps)
        return h.mul_(w.scalar)


class FusedLayerForward:
    """``FloatLayerForward`` as two fused CPU kernels around the attention backend."""

    def __init__(self, ext: ModuleType, layer: Any, w: LayerWeights, f: FusedWeights):
        self.ext, self.layer, self.w, self.f = ext, layer, w, f

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None,
                 fb: ForwardBatch) -> torch.Tensor:
        w, f, att = self.w, self.f, self.layer.self_attn
        q, k, v = self.ext.attn_pre(h, w.input_norm, f.qkv_proj, f.head_norm, cos, sin, f.q_heads, w.eps, f.onednn)
        if not att.owns_kv:
            k = v = None
        out = fb.attn_backend.forward(q, k, v, att.layer, fb)  # [n, H * D]; att.layer read now (the assistant rebinds it)
        p = w.ple
        return self.ext.decoder_post(
            h, out, f.o_proj, w.post_attention_norm, w.pre_feedforward_norm, f.gate_up, f.down, w.post_feedforward_norm,
            None if p is None else ple, None if p is None else p.gate, None if p is None else p.proj,
            None if p is None else p.norm, w.scalar, w.eps, f.onednn,
        )


def layer_weights(layer: Any) -> LayerWeights | None:
    """The layer's float32 constants, or None when the float32 fast path does not apply (MoE, or a
    norm / layer_scalar not in float32)."""
    norms = [layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
             layer.post_feedforward_layernorm]
    if layer.ple_dim:
        norms.append(layer.post_per_layer_input_norm)
    fast = [n.fast_weight() for n in norms]
    if layer.enable_moe or layer.layer_scalar.dtype != torch.float32 or not all(ok for ok, _ in fast):
        return None
    ws = [w for _, w in fast]
    ple = PleWeights(layer.per_layer_input_gate.weight, layer.per_layer_projection.weight, ws[4]) if layer.ple_dim else None
    scalar = float(layer.layer_scalar.reshape(-1)[0])
    return LayerWeights(ws[0], ws[1], ws[2], ws[3], ple, scalar, layer.eps)


def fused_weights(layer: Any) -> FusedWeights | None:
    """The fused kernels' weights for this layer, or None when they do not apply (not gelu-tanh,
    unfused q/k/v or gate/up weights, not CPU float32)."""
    att, mlp = layer.self_attn, layer.mlp
    proj = att._qkv_w if att.owns_kv else att.q_proj.weight
    if layer.hidden_activation not in GELU_TANH or att._norm_w is None or proj is None or mlp._gate_up_w is None:
        return None
    if not cpu_fused.usable_for(proj, mlp._gate_up_w):
        return None
    lay = att.layer
    head_w = att._norm_w if att.owns_kv else att._norm_w.expand(lay.num_heads, lay.head_dim)
    return FusedWeights(proj, head_w.contiguous(), lay.num_heads, att.o_proj.weight, (mlp._gate_up_w,), mlp.down_proj.weight)


def is_decoder_layer(m: nn.Module) -> bool:
    return hasattr(m, "layer_scalar") and hasattr(m, "self_attn") and hasattr(m, "mlp")


@torch.no_grad()
def apply(model: nn.Module) -> nn.Module:
    """Install the fastest applicable forward on each decoder layer of ``model`` (in place; the
    parameters and their names are untouched). Returns ``model``; ``model.cpu_linear_plan`` then says
    which library multiplies the fused layers' weights (None when no layer is fused) and
    ``model.cpu_linear_packed_bytes`` what its prepacked copies hold."""
    fused: list[tuple[nn.Module, LayerWeights, FusedWeights, ModuleType]] = []
    for m in model.modules():
        if not is_decoder_layer(m) or (w := layer_weights(m)) is None:
            continue
        f = fused_weights(m)
        ext = cpu_fused.load() if f is not None else None
        if ext is not None and f is not None:
            fused.append((m, w, f, ext))
        else:
            # An instance attribute shadows the class's forward: layer(...) and layer.forward(...) both take it.
            m.forward = FloatLayerForward(m, w)
    sized = [cpu_linear.sized_for_onednn(*f.linear_weights()) for _, _, f, _ in fused]
    packable = sum(sum(t.numel() * t.element_size() for t in f.linear_weights()) for (_, _, f, _), ok in zip(fused, sized) if ok)
    plan = cpu_linear.plan(packable) if any(sized) else (cpu_linear.LinearPlan("mkl", "weights too small for oneDNN") if fused else None)
    for (m, w, f, ext), ok in zip(fused, sized):
        m.forward = FusedLayerForward(ext, m, w, f.for_linear_mode(plan.mode if ok else "mkl"))
    model.cpu_linear_plan = plan
    # bytes of the prepacked copies held beside the parameters (the engine counts them as weights)
    model.cpu_linear_packed_bytes = packable if plan is not None and plan.mode == "packed" else 0
    return model


def fused_layer_count(model: nn.Module) -> int:
    """How many decoder layers of ``model`` run the fused kernels."""
    return sum(isinstance(m.__dict__.get("forward"), FusedLayerForward) for m in model.modules() if is_decoder_layer(m))
