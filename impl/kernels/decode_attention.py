"""Decode attention with split-KV: one query per request over its paged keys.

Stage 1: program (request b, KV head g, split s) takes the query heads of KV
group g (padded to ``BLOCK_H`` rows so tl.dot applies) and the ``s``-th slice of
the keys the query can see, ``[lo, hi)`` with ``hi = pos + 1`` and, under a
window ``W``, ``lo = pos - W + 1`` (itself and W - 1 before it: the same rule as
extend). It writes a partial output and its log-sum-exp. Stage 2 merges the
``num_kv_splits[b]`` partials of each (request, head).

The query position is explicit (``q_positions[b]``), so this kernel also serves
a YOCO back half that selected one row per request (any row, not only the last).

fp8 pools (``KV_CONVERT``) are dequantised in stage 1 as in the extend kernel: tiles converted to q's dtype,
the K scale in ``sm_scale``, the V scale on each split's partial output.
"""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import torch
import triton
import triton.language as tl

from impl.kernels.checks import check_decode_launch
from impl.kernels.tl_attention import block_scores, online_softmax_step
from impl.kernels.tl_ops import ceil_div
from impl.kernels.launch_config import DecodeLaunch, KVSplitPolicy, block_d, decode_launch
from impl.kernels.triton_env import TRITON_INTERPRETED

_NEG_FLOOR = tl.constexpr(-1.0e30)


@triton.jit
def _decode_stage1_kernel(
    Q, K_buf, V_buf, Mid_O, Mid_LSE, O,
    q_positions, kv_indptr, kv_indices, num_kv_splits,
    sm_scale, window, logit_cap, v_scale,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    KV_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_IEEE: tl.constexpr,
    DIRECT_OUT: tl.constexpr, KV_CONVERT: tl.constexpr,
):
    b = tl.program_id(0)
    kv_h = tl.program_id(1)
    split = tl.program_id(2)
    n_splits = tl.load(num_kv_splits + b)
    if split >= n_splits:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    pos = tl.load(q_positions + b).to(tl.int32)
    hi = tl.minimum(pos + 1, kv_len)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(pos - window + 1, 0)
    split_len = ceil_div(hi - lo, n_splits)
    s_lo = lo + split * split_len
    s_hi = tl.minimum(s_lo + split_len, hi)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < KV_GROUP
    heads = kv_h * KV_GROUP + offs_h  # [BLOCK_H] query heads of this KV group
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], 0.0, tl.float32) + _NEG_FLOOR
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    acc = tl.full([BLOCK_H, BLOCK_D], 0.0, tl.float32)
    for start_n in range(s_lo, s_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < s_hi  # [s_lo, s_hi) lies inside the visible range: no other mask needed
        slots = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        s = block_scores(q, Q, K_buf, slots, kv_h, stride_kt, stride_kh, offs_d, mask_n, mask_d, sm_scale, logit_cap,
                         HAS_CAP, UPCAST_DOT, DOT_IEEE, KV_CONVERT)  # [BLOCK_H, BLOCK_N]
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, m_i, l_i, acc, Q, V_buf, slots, kv_h, stride_vt, stride_vh, offs_d,
                                            mask_n, mask_d, UPCAST_DOT, DOT_IEEE, KV_CONVERT)

    nonempty = l_i > 0.0
    out = acc * (v_scale / tl.where(nonempty, l_i, 1.0))[:, None]
    if DIRECT_OUT:  # one split for every request: this is the final output, no stage 2
        tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])
    else:
        # An empty split (s_lo >= s_hi) stores lse = -inf so stage 2 gives it weight 0.
        lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        tl.store(Mid_O + b.to(tl.int64) * stride_mb + heads[:, None] * stride_mh + split * stride_ms
                 + offs_d[None, :], out, mask=mask_h[:, None] & mask_d[None, :])
        tl.store(Mid_LSE + b.to(tl.int64) * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2_kernel(
    Mid_O, Mid_LSE, O, num_kv_splits,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    n_splits = tl.load(num_kv_splits + b)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    # Vectors, not scalars: loop-carried values keep one type on every iteration.
    m = tl.full([BLOCK_D], 0.0, tl.float32) + _NEG_FLOOR
    denom = tl.full([BLOCK_D], 0.0, tl.float32)
    acc = tl.full([BLOCK_D], 0.0, tl.float32)
    base_o = Mid_O + b.to(tl.int64) * stride_mb + h * stride_mh
    base_l = Mid_LSE + b.to(tl.int64) * stride_lb + h * stride_lh
    for s in range(0, n_splits):
        lse = tl.load(base_l + s)
        part = tl.load(base_o + s * stride_ms + offs_d, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        old_scale = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * old_scale + part * w
        denom = denom * old_scale + w
        m = m_new
    out = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=mask_d)


def num_kv_splits_for(seq_lens: list[int], num_kv_heads: int, policy: KVSplitPolicy, num_sms: int | None) -> list[int]:
    """Splits per request: enough programs to fill ``num_sms`` (twice over), none shorter than
    ``min_split_tokens``, at most ``max_kv_splits``. ``num_sms=None`` (CPU): no fill limit."""
    batch = max(1, len(seq_lens))
    fill = policy.max_kv_splits if num_sms is None else max(1, triton.cdiv(2 * num_sms, batch * max(1, num_kv_heads)))
    return [max(1, min(policy.max_kv_splits, fill, triton.cdiv(n, policy.min_split_tokens))) for n in seq_lens]


def decode_attention_fwd(
    q: torch.Tensor,  # [B, H, D]
    o: torch.Tensor,  # [B, H, D] (written)
    k_buf: torch.Tensor,  # [capacity, KVH, D]
    v_buf: torch.Tensor,
    q_positions: torch.Tensor,  # [B]: position of request b's query (seq_len - 1 in plain decode)
    kv_indptr: torch.Tensor,  # [B + 1]
    kv_indices: torch.Tensor,
    num_kv_splits: torch.Tensor,  # [B] int32, each in 1..max_kv_splits
    max_kv_splits: int,  # host bound on num_kv_splits (sizes the partial buffers)
    sm_scale: float,
    window: int | None = None,
    logit_cap: float | None = None,
    k_scale: float = 1.0,  # fp8 pools store K / k_scale (1.0 otherwise)
    v_scale: float = 1.0,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor:
    name = "decode_attention_fwd"
    batch = check_decode_launch(name, q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits,
                                max_kv_splits, window, logit_cap, k_scale, v_scale)
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    if batch == 0:
        return o
    group = num_heads // num_kv_heads
    cfg = launch or decode_launch(head_dim, group, q.dtype)
    block_h = max(cfg.block_h, triton.next_power_of_2(group))  # every query head of a KV group in one program
    bd = block_d(head_dim)
    direct = max_kv_splits == 1  # num_kv_splits is all ones: stage 1 writes o itself
    parts = 1 if direct else max_kv_splits  # direct: tiny unused placeholders
    mid_o = torch.empty((1 if direct else batch, num_heads, parts, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((1 if direct else batch, num_heads, parts), dtype=torch.float32, device=q.device)
    _decode_stage1_kernel[(batch, num_kv_heads, max_kv_splits)](
        q, k_buf, v_buf, mid_o, mid_lse, o,
        q_positions, kv_indptr, kv_indices, num_kv_splits,
        float(sm_scale) * float(k_scale), int(window or 0), float(logit_cap or 0.0), float(v_scale),
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        o.stride(0), o.stride(1),
        KV_GROUP=group, HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_H=block_h, BLOCK_N=cfg.block_n,
        HAS_WINDOW=bool(window), HAS_CAP=bool(logit_cap),
        UPCAST_DOT=TRITON_INTERPRETED, DOT_IEEE=q.dtype == torch.float32, DIRECT_OUT=direct,
        KV_CONVERT=k_buf.dtype != q.dtype,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if direct:
        return o
    _decode_stage2_kernel[(batch, num_heads)](
        mid_o, mid_lse, o, num_kv_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        o.stride(0), o.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=bd,
    )
    return o
