"""TorchNativeAttnBackend: attention over the paged KV pool from per-row metadata (the CPU default backend).

On CPU, when the compiled CPU attention kernels are built (``impl/kernels/cpu_attn``, the triton
backend's kernels), every layer runs ``rows_attention`` over the plan's ``row_req`` / ``q_pos`` and
``req_to_token``: one call per layer, no gathered K/V. Everything below describes the torch-ops path
that serves otherwise (no compiler, ``IMPL_CPU_ATTN=0``, CUDA tensors) and that the tests keep covered.

Masks (see ``base.py``): key ``j`` is visible to a query at position ``p`` iff
``j <= p`` and, in a sliding layer with window ``W``, ``j > p - W``.

Per pass (``init_forward_metadata``, or ``init_cross_decoder_metadata`` for
YOCO's back half) one *plan* is built; every layer of the pass reuses it, so
index and mask tensors are made once per pass, not once per layer:

* **Sliding layers** (window ``W``): each query row gathers only its own window,
  the keys at positions ``p - W' + 1 .. p`` with ``W' = min(W, max position + 1)``
  (``[n, W']`` slots through ``req_to_token``, masked below position 0), and
  all rows of the pass (prefill chunks and decode steps alike) run as one
  batched matmul / softmax / matmul with one query row per batch entry. Work is
  ``O(n * W)``, not ``O(n * context)``. Rows of a request that extends by
  several rows (forward plans) form a *band*: one gather of the
  ``m + W' - 1`` keys its rows need, each row's window an overlapping strided
  view of it (no ``m * W'`` gathered copy; for W = 512 about 7x faster).
* **Full layers**: every request that adds several rows is its own *segment*
  (queries = its rows, keys = positions ``0..seq_len-1``) run by SDPA: its
  causal fast path without a cached prefix, an explicit mask with one. All
  requests that add one row (decode steps, YOCO's one selected row) run as
  padded batches (split into up to ``_MAX_BUCKETS`` length buckets to cut the
  padding) of batched matmuls, faster than SDPA's kernel for one query.

Gathered K/V are kept per plan and KV layer: a KV-shared layer reads exactly
the K/V its producer gathered in the same pass (the producer wrote them before
its own attention, and nothing writes that layer's buffers afterwards; a write
drops the entry). Gathers go into scratch buffers kept across passes. Scores
are computed in float32; fp8 pools are dequantised as they are gathered (element times the
layer's scale), and the compiled rows kernel dequantises them in the kernel. Results equal a dense masked attention up to float32
rounding (the summation order differs), not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.nn import functional as F

from impl.attention.base import AttentionBackend, AttentionLayer
from impl.cache.kv_quant import is_fp8
from impl.kernels import cpu_attn
from impl.forward_batch import ForwardBatch

# Gathered sliding-window K elements per chunk of query rows (bounds memory for large windows).
_WINDOW_CHUNK_ELEMS = 1 << 24
# Decode rows of full layers run in at most this many length buckets (less padding, more calls);
# one extra bucket is worth it when it saves more than this many padded key positions.
_MAX_BUCKETS = 4
_BUCKET_COST = 2048


@dataclass
class _Segment:
    """Full-attention queries of one request (or of all one-row requests, padded)."""

    q_rows: slice | torch.Tensor  # rows of q this segment reads: a slice (one request) or [b] indices (one row each)
    b: int  # requests in the segment
    m: int  # query rows per request
    kv_slots: torch.Tensor  # [b, L] KV slots of positions 0..L-1 (padded past each request's seq_len)
    mask: torch.Tensor | None = None  # m > 1: [1, 1, m, L] bool, True where the query may attend; None: causal, no prefix
    bias: torch.Tensor | None = None  # m == 1: [b, L] float32, 0 where the query may attend, -inf elsewhere


@dataclass
class _Window:
    """Sliding-window keys of every query row: ``slots[r, j]`` holds position ``pos[r] - w + 1 + j``."""

    w: int
    slots: torch.Tensor  # [n, w] KV slots (slot of position 0 where invalid)
    bias: torch.Tensor  # [n, w] float32: 0 where the position is >= 0, -inf elsewhere


@dataclass
class _Band:
    """Sliding-window keys of one request's contiguous extend rows: positions ``p0 - w + 1 .. p0 + m - 1``.

    Row ``j``'s window is ``keys[j : j + w]``, so all rows read one gathered run of ``m + w - 1``
    keys through an overlapping strided view instead of ``m * w`` gathered rows.
    """

    rows: slice  # rows of q (positions p0 .. p0 + m - 1)
    w: int
    slots: torch.Tensor  # [m + w - 1] KV slots (slot of position 0 where the position is negative)
    bias: torch.Tensor | None  # [m, w] float32 (0 / -inf) when some window starts before position 0


@dataclass
class _Plan:
    num_rows: int  # rows of q the model will pass
    q_pos: torch.Tensor  # [n] absolute position of each query row
    row_req: torch.Tensor  # [n] req_to_token row of each query row
    build_segments: Callable[[], list[_Segment]]  # full-attention work, built on first use (see ``segments``)
    windows: dict[int, _Window] = field(default_factory=dict)  # per sliding window size, built on first use
    # Sliding layers: requests extending by several rows (forward plans only) use bands; other rows windows.
    band_groups: list[tuple[int, slice, int]] = field(default_factory=list)  # (req_to_token row, q rows, first pos)
    window_rows: torch.Tensor | None = None  # [n'] rows of q run through windows (None: every row)
    bands: dict[int, list[_Band]] = field(default_factory=dict)  # per sliding window size, built on first use
    cross: bool = False  # YOCO cross-decoder plan
    # (kv_layer_id, window[, "band"]) -> gathered K/V: a (k, v) pair, or one per band / segment
    kv: dict[tuple, Any] = field(default_factory=dict)
    _window_index: tuple | None = None
    _segments: list[_Segment] | None = None

    def segments(self) -> list[_Segment]:
        """The full-attention segments, made on first use: the compiled rows kernel needs only
        ``q_pos`` / ``row_req``, so a pass it serves builds no slot tables, masks or biases."""
        if self._segments is None:
            self._segments = self.build_segments()
        return self._segments

    def window_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_pos, row_req) of the rows that run through windows (``window_rows``, or every row); made once."""
        if self._window_index is None:
            q_pos, row_req = self.q_pos, self.row_req
            if self.window_rows is not None:
                q_pos, row_req = q_pos.index_select(0, self.window_rows), row_req.index_select(0, self.window_rows)
            self._window_index = (q_pos, row_req)
        return self._window_index


class TorchNativeAttnBackend(AttentionBackend):
    name = "torch_native"

    def __init__(self, model_config, token_to_kv_pool, req_to_token_pool, device):
        super().__init__(model_config, token_to_kv_pool, req_to_token_pool, device)
        self.forward_plan: _Plan | None = None
        self.cross_plan: _Plan | None = None
        # Gather destinations kept across passes: a fresh multi-MB tensor per layer and step costs page
        # faults (the allocator hands large blocks back to the OS), more than the copy itself.
        self._scratch: dict[tuple, torch.Tensor] = {}
        # On CPU every layer's rows run the compiled rows kernel (impl/kernels/cpu_attn, the triton backend's
        # CPU kernels): one call per layer reading the pool through the plan's row_req / q_pos and
        # req_to_token, no gathered K/V. The torch ops below serve where it is not built (or IMPL_CPU_ATTN=0).
        self._rows_kernel = torch.device(device).type == "cpu" and cpu_attn.load() is not None

    # ---- metadata -----------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        starts = fb.extend_start_loc_cpu
        groups = [(i, slice(starts[i], starts[i] + n)) for i, n in enumerate(fb.extend_seq_lens_cpu)]
        if fb.spec_verify:
            # A verify block is a few rows per request: run each as a decode row (its own query position,
            # the fused sliding-window rows kernel, one batched full-attention GEMV) instead of per-request
            # bands and SDPA segments, whose fixed costs dominate at 1 + steps rows.
            groups = [(i, slice(r, r + 1)) for i, sl in groups for r in range(sl.start, sl.stop)]
        plan = self._plan(fb, groups, fb.positions, fb.num_tokens, fb.extend_seq_lens_cpu)
        # Extend rows of request i are positions prefix_i .. seq_i - 1 (as the causal fast path assumes).
        rpi = fb.req_pool_indices.tolist()
        bands = [(rpi[i], sl, fb.extend_prefix_lens_cpu[i]) for i, sl in groups if sl.stop - sl.start > 1]
        if bands:
            plan.band_groups = bands
            covered = sum(sl.stop - sl.start for _, sl, _ in bands)
            if covered < plan.num_rows:
                keep = torch.ones(plan.num_rows, dtype=torch.bool)
                for _, sl, _ in bands:
                    keep[sl] = False
                plan.window_rows = keep.nonzero().view(-1).to(plan.q_pos.device)
            else:
                plan.window_rows = plan.q_pos.new_zeros(0)
        self.forward_plan = plan
        self.cross_plan = None

    def init_cross_decoder_metadata(self, fb: ForwardBatch, rows: torch.Tensor, rows_per_req: list[int]) -> None:
        # Queries are the selected rows only (q holds them packed, request by request); each still sees
        # its request's whole context 0..seq_len-1 (prefix + this pass's rows, already written by the
        # self-decoder). No KV is written by the layers that use this plan.
        if len(rows_per_req) != fb.batch_size or sum(rows_per_req) != int(rows.shape[0]):
            raise ValueError(
                f"cross-decoder rows_per_req {rows_per_req} does not match {fb.batch_size} requests / {rows.shape[0]} rows"
            )
        groups, acc = [], 0
        for i, c in enumerate(rows_per_req):
            # verify batches: every selected row on its own, as in init_forward_metadata
            groups += [(i, slice(r, r + 1)) for r in range(acc, acc + c)] if fb.spec_verify else [(i, slice(acc, acc + c))]
            acc += c
        self.cross_plan = self._plan(fb, groups, fb.positions.index_select(0, rows), int(rows.shape[0]), rows_per_req)
        self.cross_plan.cross = True

    def _plan(self, fb: ForwardBatch, groups: list[tuple[int, slice]], q_positions: torch.Tensor, num_rows: int, counts: list[int]) -> _Plan:
        r2t = self.req_to_token_pool.req_to_token
        dev = r2t.device
        rpi_t = fb.req_pool_indices.to(dev)
        rpi = rpi_t.tolist()
        seq = fb.seq_lens_cpu
        prefix = fb.extend_prefix_lens_cpu

        def build_segments() -> list[_Segment]:
            segments = []
            singles = [(i, sl) for i, sl in groups if sl.stop - sl.start == 1]
            for i, sl in groups:
                m = sl.stop - sl.start
                if m <= 1:
                    continue
                slots = r2t[rpi[i], : seq[i]][None]  # [1, L]
                mask = None
                # Causal fast path: the queries are exactly positions 0..L-1 (no cached prefix, all rows queried).
                if not (prefix[i] == 0 and m == seq[i]):
                    kpos = torch.arange(seq[i], device=dev)
                    mask = (kpos[None, :] <= q_positions[sl][:, None])[None, None]  # [1, 1, m, L]
                segments.append(_Segment(sl, 1, m, slots, mask))
            for bucket in _length_buckets(singles, seq):
                rows = torch.tensor([sl.start for _, sl in bucket], dtype=torch.int64, device=dev)
                max_len = max(seq[i] for i, _ in bucket)
                slots = r2t[torch.tensor([rpi[i] for i, _ in bucket], device=dev), :max_len]  # [b, L]
                qp = q_positions.to(dev).index_select(0, rows)  # [b] (each <= seq_len - 1)
                valid = torch.arange(max_len, device=dev)[None, :] <= qp[:, None]
                segments.append(_Segment(rows, len(bucket), 1, slots, bias=_bias(valid)))
            return segments

        row_req = torch.repeat_interleave(rpi_t, torch.tensor(counts, dtype=torch.int64, device=dev), output_size=num_rows)
        return _Plan(num_rows, q_positions.to(dev), row_req, build_segments)

    @staticmethod
    def _window(plan: _Plan, r2t: torch.Tensor, window: int) -> _Window:
        if window not in plan.windows:
            q_pos, row_req = plan.window_positions()
            max_pos = int(q_pos.max()) if q_pos.numel() else 0
            w = max(1, min(window, max_pos + 1))  # no query sees further back than position 0
            kpos = q_pos[:, None] + torch.arange(1 - w, 1, device=r2t.device)[None, :]  # [n, w]
            slots = r2t[row_req[:, None], kpos.clamp(min=0)]  # [n, w]
            plan.windows[window] = _Window(w, slots, _bias(kpos >= 0))
        return plan.windows[window]

    @staticmethod
    def _bands(plan: _Plan, r2t: torch.Tensor, window: int) -> list[_Band]:
        if window not in plan.bands:
            out = []
            for row, sl, p0 in plan.band_groups:
                m = sl.stop - sl.start
                w = max(1, min(window, p0 + m))  # no row sees further back than position 0
                kpos = torch.arange(p0 - w + 1, p0 + m, device=r2t.device)  # [m + w - 1]
                slots = r2t[row].index_select(0, kpos.clamp(min=0))
                bias = None
                if p0 - w + 1 < 0:
                    starts = kpos[:m]  # first key position of each row's window
                    bias = _bias((starts[:, None] + torch.arange(w, device=r2t.device)[None, :]) >= 0)
                out.append(_Band(sl, w, slots, bias))
            plan.bands[window] = out
        return plan.bands[window]

    def _gather(self, kv: "_PoolKV", slots: torch.Tensor, tag: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``_gather`` but into this backend's scratch buffers for ``tag`` (one per cached entry of a plan)."""
        rows, width = slots.numel(), kv.k[0].numel()
        out = []
        for kind, buf in (("k", kv.k), ("v", kv.v)):
            have = self._scratch.get((*tag, kind))
            if have is None or have.dtype != buf.dtype or have.shape[0] < rows or have.shape[1] != width:
                have = torch.empty(max(rows, int(rows * 1.25)), width, dtype=buf.dtype, device=buf.device)
                self._scratch[(*tag, kind)] = have
            out.append(have[:rows])
        return _gather(kv, slots, (out[0], out[1]))

    # ---- compute ------------------------------------------------------------
    def store_kv(self, k, v, layer: AttentionLayer, fb: ForwardBatch) -> None:
        super().store_kv(k, v, layer, fb)
        for p in (self.forward_plan, self.cross_plan):  # the buffers changed: drop what was gathered from them
            if p is not None:
                for key in [key for key in p.kv if key[0] == layer.kv_layer_id]:
                    del p.kv[key]

    def forward(self, q, k, v, layer: AttentionLayer, fb: ForwardBatch) -> torch.Tensor:
        n = q.shape[0]
        use_cross = k is None and fb.fast_prefill and self.cross_plan is not None
        plan = self.cross_plan if use_cross else self.forward_plan
        if k is not None:
            self.store_kv(k, v, layer, fb)
        if plan is None or plan.num_rows != n:
            raise ValueError(
                f"attention metadata covers {None if plan is None else plan.num_rows} rows but layer {layer.layer_id} "
                f"passed {n}; call init_forward_metadata (or init_cross_decoder_metadata for YOCO) first."
            )
        k_buf, v_buf = self.token_to_kv_pool.get_kv_buffer(layer.kv_layer_id)
        k_scale, v_scale = self.token_to_kv_pool.get_kv_scales(layer.kv_layer_id)
        slot_map = self.token_to_kv_pool.slot_map(layer.kv_layer_id)  # hybrid pool: sliding layers' rows
        q3 = q.view(n, layer.num_heads, layer.head_dim)
        if self._rows_kernel and (q.dtype == k_buf.dtype or q.dtype == torch.float32 or is_fp8(k_buf.dtype)):
            r2t = self.req_to_token_pool.req_to_token
            out = cpu_attn.rows_attention(q3, k_buf, v_buf, r2t, plan.row_req, plan.q_pos, layer.sliding_window,
                                          layer.scaling, layer.logit_cap, k_scale, v_scale, slot_map)
            return out.reshape(n, -1)
        kv = _PoolKV(k_buf, v_buf, k_scale, v_scale, slot_map)
        if layer.sliding_window is not None:
            out = self._sliding(q3, kv, plan, layer)
        else:
            out = self._full(q3, kv, plan, layer)
        return out.to(q.dtype).reshape(n, -1)  # a strided [n, H, D] view (logit-cap path, one request) reshapes by copy

    def _sliding(self, q3, kv: "_PoolKV", plan: _Plan, layer: AttentionLayer) -> torch.Tensor:
        if not plan.band_groups:
            return self._sliding_rows(q3, kv, plan, layer)
        n, h, d = q3.shape
        window, window_rows = layer.sliding_window, plan.window_rows
        assert window is not None and window_rows is not None  # a sliding layer; a plan with bands splits its rows
        key = (layer.kv_layer_id, window, "band")
        bands = self._bands(plan, self.req_to_token_pool.req_to_token, window)
        if key not in plan.kv:
            plan.kv[key] = [_gather(kv, b.slots[None]) for b in bands]
        if len(bands) == 1 and window_rows.numel() == 0:
            kf, vf = plan.kv[key][0]
            return _attend_band(q3, bands[0], kf, vf, layer)
        out = torch.empty(n, h, d, dtype=torch.float32, device=q3.device)
        for b, (kf, vf) in zip(bands, plan.kv[key]):
            out[b.rows] = _attend_band(q3[b.rows], b, kf, vf, layer)
        if window_rows.numel():
            out[window_rows] = self._sliding_rows(q3.index_select(0, window_rows), kv, plan, layer)
        return out

    def _sliding_rows(self, q3, kv: "_PoolKV", plan: _Plan, layer: AttentionLayer) -> torch.Tensor:
        """Each row (of ``plan.window_rows``) against its own window of keys: batched ``[n * Hkv, G, w]`` scores."""
        n, h, d = q3.shape
        assert layer.sliding_window is not None  # a sliding layer
        win = self._window(plan, self.req_to_token_pool.req_to_token, layer.sliding_window)
        chunk = max(1, _WINDOW_CHUNK_ELEMS // (win.w * kv.k.shape[1] * kv.k.shape[2]))
        key = (layer.kv_layer_id, layer.sliding_window)
        if n <= chunk:
            if key not in plan.kv:
                plan.kv[key] = self._gather(kv, win.slots, (plan.cross, *key))
            ks, vs = plan.kv[key]
            return _attend_rows(q3, ks, vs, win.bias, layer)
        out = torch.empty(n, h, d, dtype=torch.float32, device=q3.device)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            ks, vs = _gather(kv, win.slots[lo:hi])
            out[lo:hi] = _attend_rows(q3[lo:hi], ks, vs, win.bias[lo:hi], layer)
        return out

    def _full(self, q3, kv: "_PoolKV", plan: _Plan, layer: AttentionLayer) -> torch.Tensor:
        n, h, d = q3.shape
        key = (layer.kv_layer_id, None)
        segments = plan.segments()
        if key not in plan.kv:
            plan.kv[key] = [
                self._gather(kv, seg.kv_slots, (plan.cross, *key, j)) for j, seg in enumerate(segments)
            ]
        gathered = plan.kv[key]
        if len(segments) == 1 and segments[0].b * segments[0].m == n:
            seg = segments[0]  # one segment covers every row (pure decode, or one prefill): no scatter
            ks, vs = gathered[0]
            return self._segment(q3, seg, ks, vs, layer)
        out = torch.empty(n, h, d, dtype=torch.float32, device=q3.device)
        for seg, (ks, vs) in zip(segments, gathered):
            out[seg.q_rows] = self._segment(q3[seg.q_rows], seg, ks, vs, layer)
        return out

    @staticmethod
    def _segment(q3, seg: _Segment, ks, vs, layer: AttentionLayer) -> torch.Tensor:
        """q3 [b * m, H, D] of one segment -> [b * m, H, D]."""
        if seg.m == 1:  # one query per request (decode rows): a batched GEMV beats SDPA's kernel here
            return _attend_rows(q3, ks, vs, seg.bias, layer)
        h, d = q3.shape[1], q3.shape[2]
        qs = q3.float().view(seg.b, seg.m, h, d).transpose(1, 2)  # [b, H, m, D]
        kt, vt = ks.transpose(1, 2), vs.transpose(1, 2)  # [b, Hkv, L, D]
        groups = h // kt.shape[1]
        if layer.logit_cap:
            if groups > 1:
                kt, vt = kt.repeat_interleave(groups, dim=1), vt.repeat_interleave(groups, dim=1)
            s = torch.matmul(qs, kt.transpose(-1, -2)) * layer.scaling
            s = torch.tanh(s / layer.logit_cap) * layer.logit_cap
            mask = seg.mask
            if mask is None:  # causal, no prefix: m == L
                mask = torch.ones(seg.m, seg.m, dtype=torch.bool, device=s.device).tril()
            o = torch.matmul(torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1), vt)
        else:
            causal = seg.mask is None
            o = F.scaled_dot_product_attention(
                qs, kt, vt, attn_mask=seg.mask, is_causal=causal, scale=layer.scaling, enable_gqa=groups > 1
            )
        return o.transpose(1, 2).reshape(seg.b * seg.m, h, d)


def _length_buckets(singles: list, seq: list[int]) -> list[list]:
    """Split one-row requests (sorted by length) into up to ``_MAX_BUCKETS`` padded batches.

    A padded batch costs ``size * max_len`` key positions; more batches cost fixed per-call work
    (about ``_BUCKET_COST`` key positions each). Equal-count splits, the count with the least total.
    """
    if not singles:
        return []
    ordered = sorted(singles, key=lambda g: seq[g[0]])
    best, best_cost = [singles], len(singles) * seq[ordered[-1][0]] + _BUCKET_COST  # one batch keeps row order
    for k in range(2, min(_MAX_BUCKETS, len(singles)) + 1):
        cuts = [round(j * len(ordered) / k) for j in range(k + 1)]
        parts = [ordered[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
        cost = sum(len(p) * seq[p[-1][0]] for p in parts) + _BUCKET_COST * len(parts)
        if cost < best_cost:
            best, best_cost = parts, cost
    return best


def _bias(allowed: torch.Tensor) -> torch.Tensor:
    """bool -> float32 additive mask (0 where allowed, -inf elsewhere)."""
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class _PoolKV:
    """One KV layer's buffers as the torch-ops path reads them: rows ``slot_map[slot]`` (or ``slot``) of
    ``k`` / ``v`` ``[N, Hkv, D]``, dequantised as ``element * scale`` (fp8 pools; 1.0 otherwise)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0
    slot_map: torch.Tensor | None = None


def _gather(
    kv: _PoolKV, slots: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """slots [b, L] -> K, V [b, L, Hkv, D] float32 (index_select on flat slots: much cheaper than ``k_buf[slots]``)."""
    k_buf, v_buf = kv.k, kv.v
    flat = slots.reshape(-1)
    if kv.slot_map is not None:
        flat = kv.slot_map.index_select(0, flat)
    shape = (*slots.shape, *k_buf.shape[1:])
    # On 2-D views: index_select copies whole rows then (about 3x faster than on [N, Hkv, D]).
    k2, v2 = k_buf.view(k_buf.shape[0], -1), v_buf.view(v_buf.shape[0], -1)
    if out is None:
        k, v = k2.index_select(0, flat), v2.index_select(0, flat)
    else:
        k, v = torch.index_select(k2, 0, flat, out=out[0]), torch.index_select(v2, 0, flat, out=out[1])
    k, v = k.view(shape).float(), v.view(shape).float()
    if kv.k_scale != 1.0:
        k = k * kv.k_scale
    if kv.v_scale != 1.0:
        v = v * kv.v_scale
    return k, v


def _attend_band(q3: torch.Tensor, band: _Band, kf: torch.Tensor, vf: torch.Tensor, layer: AttentionLayer) -> torch.Tensor:
    """q3 [m, H, D] of one band; kf/vf [1, m + w - 1, Hkv, D] -> [m, H, D] (windows as overlapping views)."""
    m, w = q3.shape[0], band.w
    hkv, d = kf.shape[2], kf.shape[3]
    kf, vf = kf.contiguous(), vf.contiguous()
    # Rows per chunk bound the [rows, H, w] scores like _WINDOW_CHUNK_ELEMS bounds gathered windows.
    chunk = max(1, _WINDOW_CHUNK_ELEMS // (w * q3.shape[1]))

    def rows(lo: int, hi: int) -> torch.Tensor:
        # Row j's keys start at key j: windows overlap, consecutive rows one key apart.
        shape, stride = (hi - lo, w, hkv, d), (hkv * d, hkv * d, d, 1)
        ks = kf.as_strided(shape, stride, kf.storage_offset() + lo * hkv * d)
        vs = vf.as_strided(shape, stride, vf.storage_offset() + lo * hkv * d)
        bias = None if band.bias is None else band.bias[lo:hi]
        return _attend_rows(q3[lo:hi], ks, vs, bias, layer)

    if m <= chunk:
        return rows(0, m)
    out = torch.empty(m, *q3.shape[1:], dtype=torch.float32, device=q3.device)
    for lo in range(0, m, chunk):
        out[lo:lo + chunk] = rows(lo, min(m, lo + chunk))
    return out


def _attend_rows(
    q3: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor, bias: torch.Tensor | None, layer: AttentionLayer
) -> torch.Tensor:
    """One query per batch entry. q3 [b, H, D]; ks/vs [b, L, Hkv, D]; bias [b, L] (0 or -inf) or None -> [b, H, D]."""
    b, h, d = q3.shape
    length, hkv = ks.shape[1], ks.shape[2]
    g = h // hkv
    qg = q3.float().reshape(b * hkv, g, d)  # heads of one KV head are adjacent
    kt = ks.transpose(1, 2).reshape(b * hkv, length, d)  # a view when Hkv == 1
    vt = vs.transpose(1, 2).reshape(b * hkv, length, d)
    s = torch.bmm(qg, kt.transpose(1, 2))  # [b * Hkv, G, L]
    if layer.scaling != 1.0:
        s = s * layer.scaling
    if layer.logit_cap:
        s = torch.tanh(s / layer.logit_cap) * layer.logit_cap
    s = s.view(b, hkv * g, length)
    if bias is not None:
        s = s.add_(bias[:, None, :])  # s is fresh (bmm or scaling output)
    p = torch.softmax(s, dim=-1).view(b * hkv, g, length)
    return torch.bmm(p, vt).view(b, h, d)
