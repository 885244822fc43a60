"""TorchNativeAttnBackend: attention with plain torch ops over the paged KV pool (the CPU path and reference).

Per pass it plans *segments*: every request that adds several rows is its own
segment (queries = its rows); all requests that add one row (decode steps, and
YOCO's one selected row per request) are batched into one padded segment. A
segment gathers its requests' K/V through ``req_to_token`` (positions
``0..seq_len-1``), masks by position (key ``j`` visible to a query at ``p`` iff
``j <= p`` and, in a sliding layer with window ``W``, ``j > p - W``) and runs
SDPA in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from impl.attention.base import AttentionBackend, AttentionLayer


@dataclass
class _Segment:
    q_rows: slice | torch.Tensor  # rows of q this segment reads: a slice (one request) or [b] indices (one row each)
    b: int  # requests in the segment
    m: int  # query rows per request
    q_pos: torch.Tensor  # [b, m] absolute positions of the queries
    kv_slots: torch.Tensor  # [b, L] KV slots of positions 0..L-1 (padded past each request's seq_len)
    k_valid: torch.Tensor  # [b, L] bool, position < seq_len
    _masks: dict = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """[b, 1, m, L] bool, True where the query may attend."""
        if window not in self._masks:
            kpos = torch.arange(self.kv_slots.shape[1], device=self.kv_slots.device)
            qp = self.q_pos[:, :, None]  # [b, m, 1]
            allowed = (kpos[None, None, :] <= qp) & self.k_valid[:, None, :]
            if window is not None:
                allowed &= kpos[None, None, :] > qp - window
            self._masks[window] = allowed[:, None]
        return self._masks[window]


@dataclass
class _Plan:
    num_rows: int  # rows of q the model will pass
    segments: list[_Segment]


class TorchNativeAttnBackend(AttentionBackend):
    name = "torch_native"

    def __init__(self, model_config, token_to_kv_pool, req_to_token_pool, device):
        self.model_config = model_config
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.device = torch.device(device)
        self.forward_plan: _Plan | None = None
        self.cross_plan: _Plan | None = None

    # ---- metadata -----------------------------------------------------------
    def init_forward_metadata(self, fb) -> None:
        starts = fb.extend_start_loc_cpu
        groups = [(i, slice(starts[i], starts[i] + n)) for i, n in enumerate(fb.extend_seq_lens_cpu)]
        self.forward_plan = self._plan(fb, groups, fb.positions, fb.num_tokens)
        self.cross_plan = None

    def init_cross_decoder_metadata(self, fb, rows: torch.Tensor, rows_per_req: list[int]) -> None:
        # Queries are the selected rows only (q holds them packed, request by request); each still sees
        # its request's whole context 0..seq_len-1 (prefix + this pass's rows, already written by the
        # self-decoder). No KV is written by the layers that use this plan.
        if len(rows_per_req) != fb.batch_size or sum(rows_per_req) != int(rows.shape[0]):
            raise ValueError(
                f"cross-decoder rows_per_req {rows_per_req} does not match {fb.batch_size} requests / {rows.shape[0]} rows"
            )
        groups, acc = [], 0
        for i, c in enumerate(rows_per_req):
            groups.append((i, slice(acc, acc + c)))
            acc += c
        self.cross_plan = self._plan(fb, groups, fb.positions.index_select(0, rows), int(rows.shape[0]))

    def _plan(self, fb, groups: list[tuple[int, slice]], q_positions: torch.Tensor, num_rows: int) -> _Plan:
        r2t = self.req_to_token_pool.req_to_token
        rpi = fb.req_pool_indices.tolist()
        seq = fb.seq_lens_cpu
        segments = []
        singles = [(i, sl) for i, sl in groups if sl.stop - sl.start == 1]
        for i, sl in groups:
            if sl.stop - sl.start > 1:
                slots = r2t[rpi[i], : seq[i]][None]  # [1, L]
                segments.append(
                    _Segment(sl, 1, sl.stop - sl.start, q_positions[sl][None], slots, torch.ones_like(slots, dtype=torch.bool))
                )
        if singles:
            rows = torch.tensor([sl.start for _, sl in singles], dtype=torch.int64, device=r2t.device)
            lens = torch.tensor([seq[i] for i, _ in singles], dtype=torch.int64, device=r2t.device)
            max_len = int(lens.max())
            slots = r2t[torch.tensor([rpi[i] for i, _ in singles], device=r2t.device), :max_len]  # [b, L]
            valid = torch.arange(max_len, device=r2t.device)[None, :] < lens[:, None]
            segments.append(_Segment(rows, len(singles), 1, q_positions.index_select(0, rows)[:, None], slots, valid))
        return _Plan(num_rows, segments)

    # ---- compute ------------------------------------------------------------
    def forward(self, q, k, v, layer: AttentionLayer, fb, save_kv_cache: bool = True) -> torch.Tensor:
        n = q.shape[0]
        if k is not None and save_kv_cache:
            d = layer.head_dim
            self.token_to_kv_pool.set_kv_buffer(layer.kv_layer_id, fb.out_cache_loc, k.view(n, -1, d), v.view(n, -1, d))
        use_cross = k is None and fb.fast_prefill and self.cross_plan is not None
        plan = self.cross_plan if use_cross else self.forward_plan
        if plan is None or plan.num_rows != n:
            raise ValueError(
                f"attention metadata covers {None if plan is None else plan.num_rows} rows but layer {layer.layer_id} "
                f"passed {n}; call init_forward_metadata (or init_cross_decoder_metadata for YOCO) first."
            )
        k_buf, v_buf = self.token_to_kv_pool.get_kv_buffer(layer.kv_layer_id)
        q3 = q.view(n, layer.num_heads, layer.head_dim)
        out = torch.empty(n, layer.num_heads, layer.head_dim, dtype=torch.float32, device=q.device)
        for seg in plan.segments:
            res = self._attend(q3[seg.q_rows], k_buf, v_buf, seg, layer)  # [b*m, H, D]
            out[seg.q_rows] = res
        return out.to(q.dtype).view(n, -1)

    @staticmethod
    def _attend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, seg: _Segment, layer: AttentionLayer) -> torch.Tensor:
        b, m, h, d = seg.b, seg.m, layer.num_heads, layer.head_dim
        qs = q.float().view(b, m, h, d).transpose(1, 2)  # [b, H, m, D]
        ks = k_buf[seg.kv_slots].float().transpose(1, 2)  # [b, Hkv, L, D]
        vs = v_buf[seg.kv_slots].float().transpose(1, 2)
        mask = seg.mask(layer.sliding_window)  # [b, 1, m, L]
        groups = h // ks.shape[1]
        if layer.logit_cap:
            ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
            s = torch.matmul(qs, ks.transpose(-1, -2)) * layer.scaling
            s = torch.tanh(s / layer.logit_cap) * layer.logit_cap
            o = torch.matmul(torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1), vs)
        else:
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=layer.scaling, enable_gqa=groups > 1)
        return o.transpose(1, 2).reshape(b * m, h, d)
