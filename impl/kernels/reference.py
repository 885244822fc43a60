"""Pure-torch references for the attention kernels (the truth the kernels are tested against).

One general form serves extend, decode and the YOCO back half: request ``b``
has queries ``q[qo_indptr[b]:qo_indptr[b+1]]`` at absolute positions
``q_positions[...]`` and keys ``0 .. kv_len_b - 1`` stored at slots
``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` of the K/V buffers (key ``j`` is at
position ``j``). A query at position ``p`` sees key ``j`` iff ``j <= p`` and, with
a window ``W``, ``j > p - W`` (itself and the ``W - 1`` keys before it).
"""

from __future__ import annotations

import torch


def attention_ref(
    q: torch.Tensor,  # [Tq, H, D]
    k_buf: torch.Tensor,  # [capacity, KVH, D]
    v_buf: torch.Tensor,  # [capacity, KVH, D]
    qo_indptr: torch.Tensor,  # [B + 1]
    q_positions: torch.Tensor,  # [Tq]
    kv_indptr: torch.Tensor,  # [B + 1]
    kv_indices: torch.Tensor,  # [kv_indptr[-1]]
    scaling: float,
    window: int | None = None,
    logit_cap: float | None = None,
    compute_dtype: torch.dtype | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [Tq, H, D] in compute_dtype (default: q.dtype)
    """Every step (scores, softmax, P @ V) runs in ``compute_dtype``: bf16 shows the
    reference's own low-precision error, fp32/fp64 give the truth. K/V are read as
    ``buffer * scale`` (fp8 pools store ``value / scale``)."""
    dt = compute_dtype or q.dtype
    num_heads, num_kv_heads = q.shape[1], k_buf.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=dt, device=q.device)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        if qo[b + 1] == qo[b]:
            continue
        qs = q[qo[b] : qo[b + 1]].to(dt)  # [n, H, D]
        slots = kv_indices[kvp[b] : kvp[b + 1]].long()
        ks = (k_buf[slots].to(dt) * k_scale).repeat_interleave(group, dim=1)  # [L, H, D]
        vs = (v_buf[slots].to(dt) * v_scale).repeat_interleave(group, dim=1)
        s = torch.einsum("nhd,lhd->hnl", qs, ks) * scaling  # [H, n, L]
        if logit_cap:
            s = logit_cap * torch.tanh(s / logit_cap)
        pos = q_positions[qo[b] : qo[b + 1]].long()[:, None]  # [n, 1]
        key = torch.arange(ks.shape[0], device=q.device)[None, :]  # [1, L]
        visible = key <= pos
        if window:
            visible &= key > pos - window
        s = s.masked_fill(~visible[None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        out[qo[b] : qo[b + 1]] = torch.einsum("hnl,lhd->nhd", p, vs)
    return out


def decode_attention_ref(q, k_buf, v_buf, q_positions, kv_indptr, kv_indices, scaling, window=None, logit_cap=None,
                         compute_dtype=None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode: one query per request (``q: [B, H, D]``) at ``q_positions[b]``."""
    qo_indptr = torch.arange(q.shape[0] + 1, device=q.device)
    return attention_ref(q, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, scaling, window, logit_cap,
                         compute_dtype, k_scale, v_scale)


def rows_attention_ref(q, k_buf, v_buf, req_to_token, row_req, q_pos, window: int, scaling: float, logit_cap: float,
                       k_scale: float = 1.0, v_scale: float = 1.0, slot_map: torch.Tensor | None = None):
    """See ``cpu_attn.rows_attention``: row ``i`` attends to positions
    ``max(0, p - window + 1) .. p`` (``window <= 0``: ``0 .. p``) of request row ``row_req[i]``
    (buffer rows ``slot_map[slot]`` when a slot map is given)."""
    n, h, _ = q.shape
    out = torch.empty_like(q)
    for i in range(n):
        p = int(q_pos[i])
        lo = max(0, p - window + 1) if window > 0 else 0
        slots = req_to_token[int(row_req[i]), lo : p + 1]
        if slot_map is not None:
            slots = slot_map[slots]
        k = (k_buf.index_select(0, slots).to(q.dtype) * k_scale).repeat_interleave(h // k_buf.shape[1], dim=1)
        v = (v_buf.index_select(0, slots).to(q.dtype) * v_scale).repeat_interleave(h // v_buf.shape[1], dim=1)
        s = torch.einsum("hd,lhd->hl", q[i], k) * scaling
        if logit_cap > 0:
            s = torch.tanh(s / logit_cap) * logit_cap
        out[i] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
    return out
