"""CPU fast paths for a loaded Gemma-4 model, applied as a transform (gpt-fast's style: the model files
``impl/model/{decoder_layer,attention,mlp}.py`` hold one reference forward each; this module builds the
faster representations from their public parameters and installs faster forwards on a built model).
``ModelRunner`` applies it on CPU only and keeps the ``CpuKernels`` record it returns.

Per decoder layer, whichever applies first:

1. ``FusedLayerForward``: the layer as two C++ kernels around the attention backend (``attn_pre``,
   ``decoder_post``; gelu-tanh layers with float32 or bfloat16 weights, extension built). Same math;
   float32 rounding may differ in the last bit (see ``__init__``), bf16 weights are multiplied with
   float32 accumulation. Their linear weights go where ``linear.py`` plans for the whole model: ATen's
   mm, oneDNN (plain or prepacked: a prepacked copy REPLACES the plain parameter, which becomes a
   storage-less meta tensor), or for bf16 the row kernel / widened float32 GEMM of ``linear.cpp``.
2. ``FloatLayerForward``: the same computation in float32 with plain function calls (no nn.Module
   dispatch per op; decode steps are bound by per-op overhead, not FLOPs). Bit-identical to the
   reference forward.
3. The layer's own ``forward`` (MoE layers, no extension for bf16 weights).

Both stack the projections once: q/k/v into one ``[(H + 2 Hkv) * D, hidden]`` weight and gate/up into one
``[2 I, hidden]`` weight (the modules' parameters become row views of them, so nothing is held twice),
the three head norms into one ``[H + 2 Hkv, D]`` scale table. Each output element is computed exactly as
by the separate ops.

With bf16 weights and the extension, every other ``nn.Linear`` of the model (the per-layer-input
projection, the assistant's projections) and the LM head (``project_to_vocab``) run ``LinearForward``
on their plain weights: a bf16 matmul of ATen on a CPU without native bf16 runs at ~0.3 GFLOP/s.

The layers are read by duck typing (attribute names of ``Gemma4DecoderLayer``), so this package imports
nothing from ``impl/model`` (the RoPE and RMSNorm both use live in ``impl/kernels/functional.py``).
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
from impl.kernels.functional import GELU_TANH, apply_rope_prepared, rms_norm
from impl.model import yoco


@dataclass(frozen=True)
class PleWeights:
    """Per-layer-embedding gate of one layer."""

    gate: torch.Tensor  # per_layer_input_gate [P, hidden]
    proj: torch.Tensor  # per_layer_projection [hidden, P]
    norm: torch.Tensor  # post_per_layer_input_norm [hidden], float32


@dataclass(frozen=True)
class LayerWeights:
    """The float32 constants a fast forward reads: norm weights (float32 copies of bf16 ones), the PLE
    gate, ``layer_scalar`` as a Python float (``h * float`` rounds exactly as ``h * tensor([s])``)."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    post_feedforward_norm: torch.Tensor
    ple: PleWeights | None
    scalar: float
    eps: float


@dataclass(frozen=True)
class StackedWeights:
    """One layer's projections stacked once (the modules' parameters become row views of them)."""

    qkv: torch.Tensor  # [(H + 2 Hkv) * D, hidden] (owning layer) or q_proj [H * D, hidden] (KV-shared)
    head_norm: torch.Tensor  # float32 [H + 2 Hkv, D] or [H, D], contiguous (v rows all ones)
    q_heads: int
    o_proj: torch.Tensor  # [hidden, H * D]
    gate_up: torch.Tensor  # [2 * I, hidden], gate rows first
    down: torch.Tensor  # [hidden, I]


@dataclass(frozen=True)
class FusedWeights:
    """The extra arguments of the two fused kernels. Linear weights are plain tensors or, with the
    ``packed`` linear mode, oneDNN-prepacked copies (same sizes); quantized ones as the extension reads them
    (W8A8 in AMX-int8 tile order where the CPU has the tiles)."""

    qkv_proj: torch.Tensor
    head_norm: torch.Tensor
    q_heads: int
    o_proj: torch.Tensor
    gate_up: tuple[torch.Tensor, ...]  # (gate_up [2 * I, hidden],) for mm; (gate [I, hidden], up [I, hidden]) for oneDNN
    down: torch.Tensor
    ple_gate: torch.Tensor | None
    ple_proj: torch.Tensor | None
    # plain weights through oneDNN (the ``onednn`` linear mode); packed bf16 ones: decode-size rows in the bf16 dot
    # products on the packed layout (the plan's packed_dots); a bf16 model's W8A16 / W4A16 layers: prefill in bf16
    # dot products (quant_linear.h's bf16_dot), their float weights through oneDNN as in the ``onednn`` mode
    onednn: bool = False

    def linear_weights(self) -> list[torch.Tensor]:
        ple = [w for w in (self.ple_gate, self.ple_proj) if w is not None]
        return [self.qkv_proj, self.o_proj, *self.gate_up, self.down, *ple]

    def main_weights(self) -> list[torch.Tensor]:
        """The weights that decide the layer's linear mode: the per-layer-input gate and projection (hidden x P,
        P = 16-256) are often under oneDNN's size floor while the rest are far above it; they keep ATen's mm
        inside a packed layer (``for_linear_mode``) instead of taking the whole layer off oneDNN."""
        return [self.qkv_proj, self.o_proj, *self.gate_up, self.down]

    def for_linear_mode(self, mode: str, packed_dots: bool = False) -> "FusedWeights":
        """These weights as the kernels take them in linear mode ``mode`` (``linear.py``); ``packed_dots``: packed
        bf16 weights' decode-size rows in the bf16 dot products (the plan's ``packed_dots``: the layer's onednn)."""
        if mode == "quant":
            return self._tiled()
        if mode == "mkl":
            return self
        (gate_up,) = self.gate_up
        i = gate_up.shape[0] // 2
        gate, up = gate_up[:i], gate_up[i:]  # row slices: contiguous views, no copy
        if mode == "onednn":
            return replace(self, gate_up=(gate, up), onednn=True)
        def p(w: torch.Tensor) -> torch.Tensor:
            return cpu_linear.pack(w, packed_dots)

        def p_sized(w: torch.Tensor) -> torch.Tensor:
            # under the floor: plain, ATen's mm (the layer's onednn is off). The floor itself, per weight:
            # sized_for_onednn is the per-layer decision apply() asks once per layer.
            return p(w) if w.numel() >= cpu_linear.MIN_WEIGHT_ELEMS else w

        ple = {} if self.ple_gate is None or self.ple_proj is None else dict(ple_gate=p_sized(self.ple_gate),
                                                                              ple_proj=p_sized(self.ple_proj))
        return replace(self, qkv_proj=p(self.qkv_proj), o_proj=p(self.o_proj), gate_up=(p(gate), p(up)), down=p(self.down),
                       onednn=packed_dots, **ple)

    def _tiled(self) -> "FusedWeights":
        """Quantized weights as the extension reads them: W8A8 and W4A8 ones in AMX-int8 tile order where the CPU
        has the tiles (``quant_linear.h``: prefill's tiles read them in place, decode's VNNI kernels too; same
        products bit for bit), every other one as it is."""
        ext = cpu_fused.load()
        if ext is None:
            return self
        hidden = self.down.shape[0]  # row-layout packed weights: [N, G, B]
        head_dim = self.head_norm.shape[1]

        def t(w: torch.Tensor | None, k: int) -> torch.Tensor | None:
            return w if w is None or not cpu_fused.is_quantized(w) else ext.quant_tile_order_(w, k)

        (gate_up,) = self.gate_up
        ple_dim = 0 if self.ple_gate is None else self.ple_gate.shape[0]
        return replace(self, qkv_proj=t(self.qkv_proj, hidden), o_proj=t(self.o_proj, self.q_heads * head_dim),
                       gate_up=(t(gate_up, hidden),), down=t(self.down, gate_up.shape[0] // 2),
                       ple_gate=t(self.ple_gate, hidden), ple_proj=t(self.ple_proj, ple_dim))

    def replaced(self, other: "FusedWeights") -> list[torch.Tensor]:
        """The linear weights of ``other`` that are not this one's (prepacked or tiled copies)."""
        mine = {id(w) for w in self.linear_weights()}
        return [w for w in other.linear_weights() if id(w) not in mine]


def _stacked_attention(att: Any, x: torch.Tensor, s: StackedWeights, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``Gemma4Attention.forward`` with one q/k/v matmul, one head norm and one RoPE (float32); ``rows`` as there."""
    lay = att.layer  # read now: the assistant rebinds it
    n, d, h = x.shape[0], lay.head_dim, lay.num_heads
    k = v = None
    if att.owns_kv:
        qkv = F.linear(x, s.qkv).view(n, -1, d)  # [n, H + 2 Hkv, D]
        qkv = rms_norm(qkv, None, eps).mul_(s.head_norm)
        hk = h + lay.num_kv_heads
        qk = apply_rope_prepared(qkv[:, :hk], cos, sin)  # [n, H + Hkv, D]
        q = qk[:, :h]
        k = qk[:, h:].reshape(n, -1)
        v = qkv[:, hk:].reshape(n, -1)
    else:
        q = apply_rope_prepared(rms_norm(F.linear(x, s.qkv).view(n, h, d), s.head_norm[0], eps), cos, sin)
    out = yoco.attend(q.reshape(n, -1), k, v, lay, fb, rows)  # [n or R, H * D]
    return F.linear(out, s.o_proj)


class FloatLayerForward:
    """The reference forward in float32 with plain function calls (stacked projections when available)."""

    def __init__(self, layer: Any, w: LayerWeights, s: StackedWeights | None):
        self.layer, self.w, self.s = layer, w, s

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None,
                 fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        w, s, layer = self.w, self.s, self.layer
        x = rms_norm(h, w.input_norm, w.eps)
        a = (layer.self_attn.forward(x, cos, sin, fb, rows) if s is None
             else _stacked_attention(layer.self_attn, x, s, w.eps, cos, sin, fb, rows))
        if rows is not None:  # Gemma4DecoderLayer.forward: the rest on the selected rows only
            h = h.index_select(0, rows)
            ple = None if ple is None else ple.index_select(0, rows)
        h = h + rms_norm(a, w.post_attention_norm, w.eps)
        x = rms_norm(h, w.pre_feedforward_norm, w.eps)
        if s is None:
            m = layer.mlp.forward(x)
        else:
            i = s.gate_up.shape[0] // 2
            gu = F.linear(x, s.gate_up)  # [T, 2 * I]
            m = F.linear(layer.mlp.act(gu[..., :i]).mul_(gu[..., i:]), s.down)
        h = h + rms_norm(m, w.post_feedforward_norm, w.eps)
        if w.ple is not None:
            g = layer.act(F.linear(h, w.ple.gate)).mul_(ple)
            h = h + rms_norm(F.linear(g, w.ple.proj), w.ple.norm, w.eps)
        return h.mul_(w.scalar)


class WidenOnce:
    """Float32 copies of the per-forward tables every fused layer reads (the RoPE cos / sin of a layer type),
    made once per forward instead of once per layer by each kernel: with a bf16 model every layer received the
    same bf16 tables and widened them again (2 ``aten::_to_copy`` per layer). The widened values equal the
    kernel's own widening, so outputs are unchanged. (The per-layer inputs [T, L, P] were widened here too
    until ``decoder_post`` learned to read bf16 rows in place.) One instance is shared by a model's fused
    layers; a source is recognised by identity and version (it is held, so its id cannot be reused while
    cached)."""

    MAX_HELD = 8  # sources per forward: 2 tables per layer type, the cross-decoder's gathered ones

    def __init__(self) -> None:
        self._held: list[tuple[torch.Tensor, int, torch.Tensor]] = []  # (source, its _version, float32 copy)
        self._fb_id = 0

    def __call__(self, t: torch.Tensor | None, fb: ForwardBatch) -> torch.Tensor | None:
        if t is None or t.dtype == torch.float32:
            return t
        if id(fb) != self._fb_id:  # a new forward: drop the last one's copies
            self._held.clear()
            self._fb_id = id(fb)
        base = t if t._base is None else t._base
        if not base.is_contiguous() or base.storage_offset() != 0:
            return t.float()
        version = 0 if base.is_inference() else base._version  # inference tensors keep no version counter
        for src, ver, wide in self._held:
            if src is base and ver == version:
                break
        else:
            wide = base.float()  # contiguous: the same strides as base, so t's view maps onto it
            if len(self._held) >= self.MAX_HELD:
                self._held.pop(0)
            self._held.append((base, version, wide))
        return wide if t is base else wide.as_strided(t.size(), t.stride(), t.storage_offset())


# Rows per oneDNN call of a batch-invariant fused layer on AMX (``FusedLayerForward.fixed_rows``).
INVARIANT_ROWS = 64


def _block(t: torch.Tensor, start: int, rows: int) -> torch.Tensor:
    """Rows [start, start + rows) of t: t itself when that is all of it (a decode step's one block; a slice costs a
    few microseconds, six a layer)."""
    return t if start == 0 and rows == t.shape[0] else t[start:start + rows]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """[n, ...] -> [rows, ...]: the last row repeated (its copies' results are dropped)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t[-1:].expand(rows - t.shape[0], *t.shape[1:])])


class FusedLayerForward:
    """``FloatLayerForward`` as two fused CPU kernels around the attention backend.

    A lone row (one-row ``h``) runs the kernels on two copies of itself when ``pads_lone_row(fb)``: oneDNN's
    linear takes another kernel for a single row (a gemv) whose rounding differs from its multi-row kernel,
    and the multi-row kernel's rows do not depend on how many rows it gets (bit-identical for 2 to 2048 rows
    of a prepacked bf16 weight). So a row gets the bits it gets inside any larger batch:

    * with fast prefill (``fb.fast_prefill``), the cross-decoder's only LM-head row: flag off computes that row
      among every row of the extend batch (always two or more), so greedy ids and logprobs stay identical on
      full-size weights too (a pure decode batch is not fast prefill and keeps the one-row kernel);
    * with ``batch_invariant`` (--enable-deterministic-inference), every lone row (batch-1 decode, a 1-token
      chunk), so a request's rows do not depend on what shares its forwards.

    The copy costs one row's arithmetic (the weights are read once either way). Only the matmuls see it: the
    attention backend gets the one row (each copy would be the same one-row query), and the copy is dropped.

    On AMX, oneDNN's multi-row kernels are not row-count invariant either: its brgemm blocking follows the
    row count, and with K >= 1024 (E2B's MLP down projection, o_proj) a row's sum runs in another order in a
    batch of 44 rows than in one of 300 (``tests/engine/test_deterministic.py``). With ``fixed_rows`` (set by
    ``apply`` for batch-invariant layers where oneDNN runs on AMX) the kernels run on blocks of exactly that
    many rows, the last one padded with copies of its last row, so every matmul call has one shape.

    A bf16 model's W8A16 / W4A16 layer (``min_rows``: ``quant_bf16_dot_min_rows``) takes its panel kernel's bf16
    dot products from that many rows and other kernels below (W4A16's row-by-row bf16 dot products, W8A16's from 4
    rows, else the float32 row kernel): in an extend batch (and with ``batch_invariant`` in every batch) fewer rows
    are padded up to ``min_rows``, so fast prefill's few cross-decoder rows get the bits flag off gives them among
    all the prompt's rows (the panel kernel's rows do not depend on the rows beside them)."""

    def __init__(self, ext: ModuleType, layer: Any, w: LayerWeights, f: FusedWeights, batch_invariant: bool = False,
                 widen: WidenOnce | None = None, fixed_rows: int = 0, min_rows: int = 0):
        self.ext, self.layer, self.w, self.f, self.batch_invariant = ext, layer, w, f, batch_invariant
        self.widen = widen or WidenOnce()
        self.fixed_rows, self.min_rows = fixed_rows, min_rows
        self.att = layer.self_attn  # (its .layer is read per call: the assistant rebinds it)

    def padded_rows(self, h: torch.Tensor, fb: ForwardBatch) -> int:
        """h's rows as the kernels take them (see the class): n, 2 for a lone row, or ``min_rows``."""
        n = int(h.shape[0])
        if 0 < n < self.min_rows and (self.batch_invariant or fb.forward_mode.is_extend):
            return self.min_rows
        return 2 if n == 1 and (self.batch_invariant or bool(fb.fast_prefill)) else n

    def _blocks(self, h: torch.Tensor, fb: ForwardBatch) -> tuple[int, int, range]:
        """(rows after padding m, rows per kernel call r, each call's first row) for h's rows: fixed blocks, a lone row as two,
        or all rows at once. Padded rows repeat the last row; the kernels' row-local work gives them its bits,
        and they are dropped."""
        n = int(h.shape[0])
        if self.fixed_rows and n:
            r = self.fixed_rows
            m = -(-n // r) * r
        else:
            r = m = self.padded_rows(h, fb)
        return m, r, range(0, m, r) if r else range(1)  # (no rows: one call on the empty batch)

    def _attn_pre(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> list[torch.Tensor]:
        """q, k, v of h's rows (one kernel call)."""
        w, f = self.w, self.f
        return self.ext.attn_pre(h, w.input_norm, f.qkv_proj, f.head_norm, cos, sin, f.q_heads, w.eps, f.onednn)

    def _decoder_post(self, h: torch.Tensor, out: torch.Tensor, ple: torch.Tensor | None) -> torch.Tensor:
        """The layer's output rows from its input rows h and their attention rows out (one kernel call)."""
        w, f, p = self.w, self.f, self.w.ple
        return self.ext.decoder_post(h, out, f.o_proj, w.post_attention_norm, w.pre_feedforward_norm, f.gate_up, f.down,
                                     w.post_feedforward_norm, None if p is None else ple, f.ple_gate, f.ple_proj,
                                     None if p is None else p.norm, w.scalar, w.eps, f.onednn)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ple: torch.Tensor | None,
                 fb: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        att = self.att
        # (the per-layer inputs reach decoder_post as they are: it reads bf16 rows with their strides)
        cos, sin = self.widen(cos, fb), self.widen(sin, fb)
        if rows is None and not self.fixed_rows and self.padded_rows(h, fb) == int(h.shape[0]):
            # every row at once, in one call each (a decode step): the general path below without its blocks
            q, k, v = self._attn_pre(h, cos, sin)
            if not att.owns_kv:
                k = v = None
            return self._decoder_post(h, yoco.attend(q, k, v, att.layer, fb, None), ple)
        n = int(h.shape[0])
        m, r, starts = self._blocks(h, fb)
        hp, cp, sp = _pad_rows(h, m), _pad_rows(cos, m), _pad_rows(sin, m)
        parts = [self._attn_pre(_block(hp, i, r), _block(cp, i, r), _block(sp, i, r)) for i in starts]
        q, k, v = parts[0] if len(parts) == 1 else tuple(torch.cat([p[j] for p in parts]) for j in range(3))
        if m != n:
            q, k, v = q[:n], k[:n], v[:n]
        if not att.owns_kv:
            k = v = None
        # [n, H * D], or [R, H * D] with rows (yoco.attend); att.layer read now (the assistant rebinds it)
        out = yoco.attend(q, k, v, att.layer, fb, rows)
        if rows is not None:  # the rest of the layer on the selected rows only (their own blocks and padding)
            h = h.index_select(0, rows)
            ple = None if ple is None else ple.index_select(0, rows)
            n = int(h.shape[0])
            m, r, starts = self._blocks(h, fb)
            hp = _pad_rows(h, m)
        out, pp = _pad_rows(out, m), None if ple is None else _pad_rows(ple, m)
        outs = [self._decoder_post(_block(hp, i, r), _block(out, i, r), None if pp is None else _block(pp, i, r))
                for i in starts]
        h = outs[0] if len(outs) == 1 else torch.cat(outs)
        return h[:n] if m != n else h


class LinearForward:
    """``nn.Linear``'s forward (no bias) through the extension's ``linear`` (any weight kind), in x's dtype.
    ``rows_only``: the bf16 row kernel at every row count (each row's sum in one order whatever the batch:
    --enable-deterministic-inference), not oneDNN or a widened GEMM above ``BF16_ROW_KERNEL_MAX_ROWS``."""

    def __init__(self, ext: ModuleType, weight: torch.Tensor, onednn: bool, out_dtype: torch.dtype | None = None,
                 rows_only: bool = False):
        self.ext, self.weight, self.onednn, self.out_dtype, self.rows_only = ext, weight, onednn, out_dtype, rows_only

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.native(x)  # oneDNN's bf16 output is what ext.linear would have widened: the same values
        return y.view(*x.shape[:-1], y.shape[-1]).to(self.out_dtype or x.dtype)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        """The product [rows, out] as the matmul leaves it: bf16 from oneDNN's bf16 matmul (no float32 copy of
        a wide output: for the per-layer-input projection of 1024 rows, 36 MB and 11 ms), else float32."""
        x2 = x.reshape(-1, x.shape[-1])
        return self.ext.bf16_rows(x2, self.weight) if self.rows_only else self.ext.linear_native(x2, self.weight, self.onednn)


class PleInputsKernel:
    """The per-layer inputs of a bf16 model (impl/model/ple.py's formula, which calls this as its ``fused``
    path) as the projection's product and one pass of the extension's ``ple_inputs`` over [T, L * P],
    each step rounded to bf16 where the eager model rounds it: the eager ops make ~10 whole-tensor passes
    (scales, a float32 copy for the RMSNorm and back, the sum; ~45 ms of a 1024-token E2B prefill, the kernel
    ~7 ms). The RMSNorm's sum of squares is the kernel's own order (the eager ``F.rms_norm`` can differ in the
    last bit)."""

    # A quantized projection's float32 product [T, L * P] is taken ROWS rows at a time: E2B's 8960 columns make
    # 1024 rows 37 MB, above glibc's largest mmap threshold (32 MB), so each prefill mapped it afresh and took a
    # page fault per 4 KB written (~9000 per 1024 rows, ~4% of a W8A8 prefill on the AMX Xeon); 512 rows come
    # from the heap. Its rows are independent (per-row activation scales, integer products), so the bits are
    # the same; oneDNN's bf16 product (half the bytes, not row-count invariant) stays one call.
    ROWS = 512

    def __init__(self, ext: ModuleType, projection: LinearForward):
        self.ext, self.projection = ext, projection
        self.chunked = cpu_fused.is_quantized(projection.weight)

    def __call__(self, embeds: torch.Tensor, tok: torch.Tensor, norm_w: torch.Tensor, eps: float, ple_dim: int,
                 tok_scale: float, out_scale: float) -> torch.Tensor:
        """embeds [T, hidden] bf16; tok [T, L * P] the table's gathered rows (bf16); norm_w [P] -> [T, L * P] bf16."""
        n = embeds.shape[0]
        tok2 = tok.reshape(n, -1)
        if not self.chunked or n <= self.ROWS:
            return self._rows(embeds, tok2, norm_w, eps, ple_dim, tok_scale, out_scale)
        return torch.cat([self._rows(embeds[i:i + self.ROWS], tok2[i:i + self.ROWS], norm_w, eps, ple_dim, tok_scale,
                                     out_scale) for i in range(0, n, self.ROWS)])

    def _rows(self, embeds, tok, norm_w, eps, ple_dim, tok_scale, out_scale) -> torch.Tensor:
        y = self.projection.native(embeds)  # [T, L * P] bf16 (oneDNN) or float32
        return self.ext.ple_inputs(y, tok, norm_w, ple_dim, embeds.shape[-1] ** -0.5, tok_scale, out_scale, eps, True)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


def layer_weights(layer: Any, float32_only: bool) -> LayerWeights | None:
    """The layer's constants as float32, or None when no fast path applies (MoE; with ``float32_only``
    a norm or ``layer_scalar`` not in float32)."""
    norms = [layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
             layer.post_feedforward_layernorm]
    if layer.ple_dim:
        norms.append(layer.post_per_layer_input_norm)
    if layer.enable_moe or any(not n.with_scale for n in norms):
        return None
    if float32_only and (layer.layer_scalar.dtype != torch.float32 or any(n.weight.dtype != torch.float32 for n in norms)):
        return None
    ws = [_f32(n.weight) for n in norms]
    ple = PleWeights(layer.per_layer_input_gate.weight, layer.per_layer_projection.weight, ws[4]) if layer.ple_dim else None
    scalar = float(layer.layer_scalar.reshape(-1)[0])
    return LayerWeights(ws[0], ws[1], ws[2], ws[3], ple, scalar, layer.eps)


def _as_view_of(lin: nn.Linear, fused: torch.Tensor, lo: int, hi: int) -> None:
    lin.weight = nn.Parameter(fused[lo:hi], requires_grad=False)


@torch.no_grad()
def stack_weights(layer: Any) -> StackedWeights | None:
    """Stack the layer's q/k/v and gate/up weights (its parameters become views of the stacked tensors),
    or None when its projections or q/k norms are not all of one dtype with scales."""
    att, mlp, lay = layer.self_attn, layer.mlp, layer.self_attn.layer
    h, hkv, d = lay.num_heads, lay.num_kv_heads, lay.head_dim
    norms = [att.q_norm] + ([att.k_norm] if att.owns_kv else [])
    if any(not n.with_scale for n in norms):
        return None
    parts = [att.q_proj] + ([att.k_proj, att.k_proj if att.v_proj is None else att.v_proj] if att.owns_kv else [])
    dtype = att.q_proj.weight.dtype
    if any(p.weight.dtype != dtype for p in [*parts, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]):
        return None
    qw = _f32(att.q_norm.weight)
    if att.owns_kv:
        qkv = torch.cat([p.weight for p in parts], dim=0)  # [(H + 2 Hkv) * D, hidden]
        # With k_eq_v the V rows repeat k_proj's (V is the k projection before k_norm and RoPE).
        _as_view_of(att.q_proj, qkv, 0, h * d)
        _as_view_of(att.k_proj, qkv, h * d, (h + hkv) * d)
        if att.v_proj is not None:
            _as_view_of(att.v_proj, qkv, (h + hkv) * d, (h + 2 * hkv) * d)
        ones = torch.ones(hkv, d, dtype=torch.float32, device=qw.device)  # v_norm has no scale
        head_norm = torch.cat([qw.expand(h, d), _f32(att.k_norm.weight).expand(hkv, d), ones], dim=0)
    else:
        qkv = att.q_proj.weight
        head_norm = qw.expand(h, d).contiguous()
    i = mlp.intermediate
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)  # [2 * I, hidden]
    _as_view_of(mlp.gate_proj, gate_up, 0, i)
    _as_view_of(mlp.up_proj, gate_up, i, 2 * i)
    return StackedWeights(qkv, head_norm.contiguous(), h, att.o_proj.weight, gate_up, mlp.down_proj.weight)


def fused_weights(layer: Any, s: StackedWeights, w: LayerWeights) -> FusedWeights | None:
    """The fused kernels' weights for this layer, or None when they do not apply (not gelu-tanh, weights
    not all CPU float32 or all CPU bfloat16)."""
    ple = [] if w.ple is None else [w.ple.gate, w.ple.proj]
    if layer.hidden_activation not in GELU_TANH:
        return None
    if cpu_fused.is_quantized(s.qkv):
        # the extension's linear reads each weight by its own kind: a PLE weight too narrow to quantize
        # (impl/quant/loading.py) stays float beside quantized projections
        if not cpu_fused.usable_for(s.qkv, s.o_proj, s.gate_up, s.down) or not all(
                cpu_fused.usable_for(p) or cpu_fused.usable_for(s.qkv, p) for p in ple):
            return None
    elif not cpu_fused.usable_for(s.qkv, s.o_proj, s.gate_up, s.down, *ple):
        return None
    return FusedWeights(s.qkv, s.head_norm, s.q_heads, s.o_proj, (s.gate_up,), s.down,
                        None if w.ple is None else w.ple.gate, None if w.ple is None else w.ple.proj)


def is_decoder_layer(m: nn.Module) -> bool:
    return hasattr(m, "layer_scalar") and hasattr(m, "self_attn") and hasattr(m, "mlp")


# The plain parameters a prepacked copy replaces, per decoder layer (attribute paths).
_PACKED_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection")


def _release_packed(layer: nn.Module) -> None:
    """Replace the layer's linear weights (now held prepacked by its fused forward) with storage-less meta
    tensors of the same shape and dtype. Nothing else reads them: the layer's own forward is shadowed by
    the fused one."""
    for path in _PACKED_LINEARS:
        mod: Any = layer
        for part in path.split("."):
            mod = getattr(mod, part, None)
        if mod is not None:
            p = mod.weight
            mod.weight = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)


def storage_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages behind the model's parameters (views of one stacked weight count once;
    meta tensors hold none)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        if not p.is_meta:
            st = p.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


@dataclass(frozen=True)
class CpuKernels:
    """What ``apply`` installed on a model (the model runner's record of it)."""

    layer_paths: tuple[str, ...]  # per decoder layer: "fused" | "float" | "module"
    weight_dtype: str  # dtype of the decoder layers' linear weights
    linear: cpu_linear.LinearPlan | None  # the fused layers' linear library (None: no layer fused)
    isa: str  # SIMD the extension was built for ("" without it)
    other_linears: tuple[str, ...] = ()  # modules outside the fused layers on LinearForward ("project_to_vocab": LM head)
    packed_bytes: int = 0  # bytes of prepacked weight copies (oneDNN bf16 / float32, W8A8 / W4A8 in tile order): they replace their parameters
    # bytes the transform added to the loaded parameters' (stacked weights, prepacked copies, float32 norm
    # copies, minus the storages they replaced): what the engine adds to the weights' bytes
    extra_bytes: int = 0
    unavailable: str = ""  # why no layer runs the fused kernels (when none does)
    # per decoder layer: the linear mode of a fused layer ("packed" | "onednn" | "mkl"; a layer whose weights
    # are under oneDNN's size floor keeps "mkl" whatever the plan says), "" for the other paths
    layer_linear: tuple[str, ...] = ()
    batch_invariant: bool = False  # other_linears on the row kernel at every row count (deterministic inference)

    @property
    def fused_layers(self) -> int:
        return sum(p == "fused" for p in self.layer_paths)

    def routes(self) -> dict[str, list[int]]:
        """Which path serves which decoder layer: "fused, <linear mode>", "float" or "module" -> layer indices."""
        out: dict[str, list[int]] = {}
        modes = self.layer_linear or ("",) * len(self.layer_paths)
        for i, (path, mode) in enumerate(zip(self.layer_paths, modes)):
            out.setdefault(f"{path}, {mode}" if path == "fused" and mode else path, []).append(i)
        return out

    def describe(self) -> str:
        """The startup log's ``CPU kernels: ...`` text."""
        n = len(self.layer_paths)
        if not self.fused_layers:
            return f"torch ops ({self.unavailable})" if self.unavailable else "torch ops"
        what = f"fused decoder layers ({self.fused_layers} of {n}, {self.weight_dtype} weights"
        if self.fused_layers < n:
            others = {k: v for k, v in self.routes().items() if not k.startswith("fused")}
            what += "; " + "; ".join(f"{_ranges(v)} on {k}" for k, v in others.items())
        text = f"{what}) and sliding-window attention (C++ extension, {self.isa} build)"
        if self.linear is not None:
            text += f"; linear layers: {self.linear.describe()}"
            small = [i for i, m in enumerate(self.layer_linear) if m == "mkl" and self.layer_paths[i] == "fused"]
            if small and self.linear.mode != "mkl":
                text += f"; {_ranges(small)} keep{'s' if len(small) == 1 else ''} {cpu_linear.small_weights_plan(getattr(torch, self.linear.dtype)).describe()}"
        if self.other_linears:
            text += f"; also {', '.join(self.other_linears)} on the extension's linear"
            if self.batch_invariant:
                text += " (its bf16 row kernel at every row count: batch-invariant)"
        return text

    def info(self) -> dict[str, Any]:
        """What ``/get_server_info`` reports under ``cpu_kernels``."""
        return {
            "layers": {k: self.layer_paths.count(k) for k in ("fused", "float", "module") if k in self.layer_paths},
            "routes": self.routes(),
            "weight_dtype": self.weight_dtype,
            "isa": self.isa,
            "linear": None if self.linear is None else self.linear.info(),
            "other_linears": list(self.other_linears),
            "batch_invariant": self.batch_invariant,
            "packed_bytes": self.packed_bytes,
            "extra_bytes": self.extra_bytes,
            "describe": self.describe(),
        }


def _unavailable_reason(dtype: torch.dtype) -> str:
    if not cpu_fused.enabled_by_env():
        return f"{cpu_fused.ENV_SWITCH}=0"
    if cpu_fused.error():
        return f"fused kernels unavailable: {cpu_fused.error()}"
    return "the fused kernels serve gelu-tanh layers with float32 or bfloat16 weights only"


@torch.no_grad()
def apply(model: nn.Module, batch_invariant: bool = False) -> CpuKernels:
    """Install the fastest applicable forward on each decoder layer of ``model`` (in place; parameter names
    are untouched; prepacked weights replace their parameters). Returns the record of what it installed.
    ``batch_invariant`` (--enable-deterministic-inference): the bf16 linears outside the fused layers and the
    LM head take the row kernel at every row count, and the fused layers run a lone row as two (their
    prepacked oneDNN matmuls give a row the same result for any batch of two or more rows:
    ``FusedLayerForward``)."""
    before = storage_bytes(model)
    layers = [m for m in model.modules() if is_decoder_layer(m)]
    paths: list[str] = []
    fused: list[tuple[nn.Module, LayerWeights, FusedWeights | None, ModuleType]] = []
    dtypes: set[torch.dtype] = set()
    for m in layers:
        ext = cpu_fused.load()
        w = layer_weights(m, float32_only=ext is None)
        if w is None:
            paths.append("module")
            continue
        s = stack_weights(m)
        f = fused_weights(m, s, w) if s is not None and ext is not None else None
        if ext is not None and f is not None:
            fused.append((m, w, f, ext))
            dtypes.add(f.qkv_proj.dtype)
            paths.append("fused")
        elif (s.qkv.dtype if s is not None else m.self_attn.q_proj.weight.dtype) == torch.float32 \
                and not any(cpu_fused.is_quantized(p) for p in m.parameters()):
            # An instance attribute shadows the class's forward: layer(...) and layer.forward(...) both take it.
            m.forward = FloatLayerForward(m, w, s)
            paths.append("float")
        else:
            paths.append("module")
    weight_dtype = str(next(iter(dtypes)) if len(dtypes) == 1 else model_dtype(model)).replace("torch.", "")
    quant = getattr(getattr(model, "weight_plan", None), "quant", None)  # impl/quant/loading.QuantTargets
    if quant is not None:
        weight_dtype = quant.scheme.fmt.kind
    plan = None
    bf16_dot = False  # W8A16 / W4A16 prefill (and decode) in bf16 dot products (quant_linear.h)
    packed = 0
    modes: dict[int, str] = {}  # id(fused layer) -> its linear mode
    held: list[torch.Tensor] = []  # tensors the installed forwards hold outside the parameters
    if fused:
        sized = [cpu_linear.sized_for_onednn(*f.main_weights()) for _, _, f, _ in fused]
        dtype = fused[0][2].qkv_proj.dtype
        if cpu_fused.is_quantized(fused[0][2].qkv_proj):
            bf16_dot = cpu_linear.quant_bf16_dot(model_dtype(model))
            plan = cpu_linear.quant_plan(quant.scheme.fmt.name() if quant is not None else "quantized", bf16_dot)
            sized = [True] * len(fused)
        else:
            plan = cpu_linear.plan(dtype, batch_invariant) if any(sized) else cpu_linear.small_weights_plan(dtype)
        widen = WidenOnce()  # shared: each table is widened once per forward
        for i, ok in enumerate(sized):
            m, w, f, ext = fused[i]
            # the list lets go of the layer's plain weights: once its copies replace them they go with the last
            # reference (the peak while packing holds one layer's copies beside the plain weights, not all of them)
            fused[i] = (m, w, None, ext)
            mode = plan.mode if ok else "mkl"
            modes[id(m)] = mode
            g = f.for_linear_mode(mode, plan.packed_dots)
            min_rows = 0
            if mode == "quant" and bf16_dot and g.qkv_proj.dtype == torch.uint8:  # a weight-only layer
                g = replace(g, onednn=True)  # its linears round x to bf16 (quant_linear's bf16_dot), as oneDNN would
                min_rows = ext.quant_bf16_dot_min_rows()
            copies = f.replaced(g) if mode in ("packed", "quant") else []  # (onednn: row views of gate_up)
            if copies:  # prepacked (oneDNN) or tiled (W8A8, W4A8) copies replace the plain weights
                if w.ple is not None and g.ple_gate is not None and g.ple_proj is not None:
                    w = replace(w, ple=replace(w.ple, gate=g.ple_gate, proj=g.ple_proj))  # hold no plain copy
                packed += sum(t.numel() * t.element_size() for t in copies)
                _release_packed(m)
            # batch invariance on AMX: oneDNN's blocking follows the row count (FusedLayerForward.fixed_rows)
            fixed = INVARIANT_ROWS if batch_invariant and mode == "packed" and cpu_linear.bf16_isa() == "amx_bf16" else 0
            m.forward = FusedLayerForward(ext, m, w, g, batch_invariant, widen, fixed, min_rows)
            held += [t for t in (w.input_norm, w.post_attention_norm, w.pre_feedforward_norm, w.post_feedforward_norm,
                                 g.head_norm, None if w.ple is None else w.ple.norm) if t is not None]
    ext = cpu_fused.load()
    others = _install_linears(model, ext, plan, {id(m) for m, _, _, _ in fused}, batch_invariant,
                              bf16_dot) if ext is not None else ()
    after = storage_bytes(model) + packed + sum(t.numel() * t.element_size() for t in held)
    return CpuKernels(tuple(paths), weight_dtype, plan, ext.simd_isa() if ext is not None else "", others, packed,
                      after - before, "" if fused else _unavailable_reason(model_dtype(model)),
                      tuple(modes.get(id(m), "") for m in layers), batch_invariant)


def _ranges(layers: list[int]) -> str:
    """[5] -> "layer 5"; [0, 1, 2, 5, 7, 8] -> "layers 0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def model_dtype(model: nn.Module) -> torch.dtype:
    return getattr(model, "dtype", None) or next(model.parameters()).dtype


def _install_linears(model: nn.Module, ext: ModuleType, plan: cpu_linear.LinearPlan | None, fused_ids: set[int],
                     rows_only: bool = False, bf16_dot: bool = False) -> tuple[str, ...]:
    """bf16 ``nn.Linear`` modules outside the fused layers, and the LM head, onto ``LinearForward`` (plain
    weights; oneDNN above the row kernel's row count only where the CPU has native bf16; ``rows_only``: the
    row kernel at every row count). Quantized ones too, W8A16 / W4A16 in bf16 dot products with ``bf16_dot``
    (the per-layer-input projection: every prompt row, flag on or off); the LM head's copy keeps float32 x.
    Only a bf16 model's take oneDNN's bf16 matmul or the bf16 dot products (both round x to bf16): a float32
    model's bf16 table (its tied LM head keeps the checkpoint's bf16) multiplies float32 x in float32 arithmetic
    (the dot products on its one-row logits put the first token's top-10 logprobs 6e-3 off transformers' float32
    at full size, make parity-full's threshold 1e-3)."""
    onednn = (cpu_linear.native_bf16() and plan is not None and plan.mode in ("packed", "onednn")
              and plan.dtype == "bfloat16")
    names: list[str] = []
    skip: set[int] = set()
    for m in model.modules():
        if id(m) in fused_ids:
            skip.update(id(c) for c in m.modules())
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or id(m) in skip or m.bias is not None or m.weight.device.type != "cpu" \
                or not m.weight.is_contiguous():
            continue
        if cpu_fused.is_quantized(m.weight):  # packed (impl/quant): the extension's linear reads it
            # (W8A8 / W4A8 in tile order where the CPU has AMX-int8 tiles: rearranged in place, so the parameter
            # becomes the tiled view of its own storage)
            tiled = ext.quant_tile_order_(m.weight, m.in_features)
            if tiled is not m.weight:
                m.weight = nn.Parameter(tiled, requires_grad=False)
            m.forward = LinearForward(ext, m.weight, bf16_dot)
            names.append(name)
        elif m.weight.dtype == torch.bfloat16:
            m.forward = LinearForward(ext, m.weight, onednn, rows_only=rows_only)
            names.append(name)
    head = getattr(model, "lm_head_weight", None)
    packed_head = getattr(model, "lm_head_quant", None)  # impl/quant/loading.quantize_lm_head
    if packed_head is not None:
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        if hidden is not None:  # W8A8 in tile order where the CPU has AMX-int8 tiles (in place, as above)
            model.lm_head_quant = packed_head = ext.quant_tile_order_(packed_head, hidden)
        model.project_to_vocab = LinearForward(ext, packed_head, False, out_dtype=torch.float32)
        names.append("project_to_vocab")
    elif callable(head) and hasattr(model, "project_to_vocab"):
        w = head()
        if w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.is_contiguous():
            # the LM head keeps its plain weight: the tied embedding gathers rows of it
            model.project_to_vocab = LinearForward(ext, w, onednn, out_dtype=torch.float32, rows_only=rows_only)
            names.append("project_to_vocab")
    proj = getattr(model, "per_layer_model_projection", None)
    if getattr(model, "ple_dim", 0) and isinstance(getattr(proj, "forward", None), LinearForward) \
            and model_dtype(model) == torch.bfloat16 and hasattr(model, "ple_fused"):
        model.ple_fused = PleInputsKernel(ext, proj.forward)  # impl/model/ple.py's fused path
        names.append("per_layer_inputs")
    return tuple(names)
