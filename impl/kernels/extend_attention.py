"""Extend attention over the paged KV cache (also serves the YOCO back half).

General form (see ``reference.attention_ref``): request ``b`` has query rows
``qo_indptr[b]:qo_indptr[b+1]`` with explicit absolute positions and keys read
through ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (key ``j`` at position
``j``). The engine writes the new tokens' K/V before attention, so one pass over
``kv_indices`` covers cached prefix and new tokens alike; in the YOCO back half
the queries are just the selected rows over the same keys.

One program = one request x one KV head x ``BLOCK_M`` lanes (query rows x the
query heads of that KV group); it walks only the key blocks some of its queries
can see (from the lowest query's window start to the highest query's position),
with online softmax in fp32.

fp8 pools (``KV_CONVERT``, also a bfloat16 / float16 pool under float32 queries): K and V tiles load in
the pool's dtype and are converted to q's dtype before the dots
(dequantised in the kernel); the layer's K scale multiplies the scores (``sm_scale * k_scale``), its V
scale the output.
"""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import torch
import triton
import triton.language as tl

from impl.kernels.checks import check_extend_launch
from impl.kernels.tl_attention import block_scores, online_softmax_step
from impl.kernels.tl_ops import reduce_max, reduce_min
from impl.kernels.launch_config import ExtendLaunch, block_d, extend_launch
from impl.kernels.triton_env import TRITON_INTERPRETED

# Scores start from a finite floor so fully masked blocks give exp(-inf - floor) = 0, not NaN.
_NEG_FLOOR = tl.constexpr(-1.0e30)


@triton.jit
def _extend_attn_kernel(
    Q, K_buf, V_buf, O,
    qo_indptr, q_positions, kv_indptr, kv_indices,
    sm_scale, window, logit_cap, v_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    KV_GROUP: tl.constexpr, ROWS_PER_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_IEEE: tl.constexpr,
    KV_CONVERT: tl.constexpr,
):
    # GQA packing: the BLOCK_M lanes of a program are ROWS_PER_BLOCK query rows x the KV_GROUP query
    # heads sharing KV head kv_h (lane i: row i // KV_GROUP, head i % KV_GROUP), so every K/V tile
    # is loaded once for the whole group.
    b = tl.program_id(0)
    kv_h = tl.program_id(1)
    m_block = tl.program_id(2)

    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    if m_block * ROWS_PER_BLOCK >= q_len:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start

    lane = tl.arange(0, BLOCK_M)
    offs_m = m_block * ROWS_PER_BLOCK + lane // KV_GROUP  # [BLOCK_M] query row within the request
    heads = kv_h * KV_GROUP + lane % KV_GROUP  # [BLOCK_M] query head
    mask_m = (lane < ROWS_PER_BLOCK * KV_GROUP) & (offs_m < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    # pos: [BLOCK_M]; padded lanes get -1 and so see no key.
    pos = tl.load(q_positions + q_start + offs_m, mask=mask_m, other=-1).to(tl.int32)
    q = tl.load(Q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Key range any row of this block can see: [lo, hi).
    hi = tl.minimum(reduce_max(pos, 0) + 1, kv_len)
    lo = 0
    if HAS_WINDOW:
        lowest = reduce_min(tl.where(mask_m, pos, 2147483647), 0)
        lo = tl.maximum(lowest - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N  # aligned loads

    m_i = tl.full([BLOCK_M], 0.0, tl.float32) + _NEG_FLOOR
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        s = block_scores(q, Q, K_buf, slots, kv_h, stride_kt, stride_kh, offs_d, mask_n, mask_d, sm_scale, logit_cap,
                         HAS_CAP, UPCAST_DOT, DOT_IEEE, KV_CONVERT)  # [BLOCK_M, BLOCK_N] fp32
        visible = (offs_n[None, :] <= pos[:, None]) & mask_n[None, :]
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, m_i, l_i, acc, Q, V_buf, slots, kv_h, stride_vt, stride_vh, offs_d,
                                            mask_n, mask_d, UPCAST_DOT, DOT_IEEE, KV_CONVERT)

    out = acc * (v_scale / tl.where(l_i == 0.0, 1.0, l_i))[:, None]
    tl.store(O + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=mask_m[:, None] & mask_d[None, :])


def extend_attention_fwd(
    q: torch.Tensor,  # [Tq, H, D]
    o: torch.Tensor,  # [Tq, H, D] (written)
    k_buf: torch.Tensor,  # [capacity, KVH, D]
    v_buf: torch.Tensor,  # [capacity, KVH, D]
    qo_indptr: torch.Tensor,  # [B + 1] int32
    q_positions: torch.Tensor,  # [Tq] int32/int64
    kv_indptr: torch.Tensor,  # [B + 1] int32
    kv_indices: torch.Tensor,  # [>= kv_indptr[-1]] int32/int64 slots
    max_q_len: int,  # host copy of max(qo_indptr[b+1] - qo_indptr[b])
    sm_scale: float,
    window: int | None = None,  # W: a query at p sees keys in (p - W, p]
    logit_cap: float | None = None,
    k_scale: float = 1.0,  # fp8 pools store K / k_scale (1.0 otherwise)
    v_scale: float = 1.0,
    launch: ExtendLaunch | None = None,
) -> torch.Tensor:
    name = "extend_attention_fwd"
    batch = check_extend_launch(name, q, o, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, window,
                                logit_cap, k_scale, v_scale)
    if batch == 0 or q.shape[0] == 0 or max_q_len == 0:
        return o
    head_dim = q.shape[2]
    num_heads, num_kv_heads = q.shape[1], k_buf.shape[1]
    group = num_heads // num_kv_heads
    cfg = launch or extend_launch(head_dim, q.dtype)
    block_m = max(cfg.block_m, triton.next_power_of_2(group))  # a block holds at least one row of every head
    rows_per_block = block_m // group
    grid = (batch, num_kv_heads, triton.cdiv(max_q_len, rows_per_block))
    _extend_attn_kernel[grid](
        q, k_buf, v_buf, o,
        qo_indptr, q_positions, kv_indptr, kv_indices,
        float(sm_scale) * float(k_scale), int(window or 0), float(logit_cap or 0.0), float(v_scale),
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        o.stride(0), o.stride(1),
        KV_GROUP=group, ROWS_PER_BLOCK=rows_per_block, HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim),
        BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        HAS_WINDOW=bool(window), HAS_CAP=bool(logit_cap),
        UPCAST_DOT=TRITON_INTERPRETED,  # the interpreter's tl.dot mishandles bf16 (stored as uint16)
        DOT_IEEE=q.dtype == torch.float32,  # fp32 inputs: no TF32 rounding
        KV_CONVERT=k_buf.dtype != q.dtype,  # check_extend_launch: fp8, or a half-precision pool under float32 q
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o
