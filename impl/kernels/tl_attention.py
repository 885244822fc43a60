"""The two halves of one key block of online-softmax attention, shared by the decode (``decode_attention.py``) and
extend (``extend_attention.py``) kernels: the block's scores, then the running max / sum / output update. Each
kernel keeps its own masks (causal, window, split range) between the two.

Shapes: ``q`` [M, BLOCK_D] (M query lanes: a KV group's heads for decode, rows x heads for extend); a block of
BLOCK_N keys at pool ``slots`` [BLOCK_N]; scores [M, BLOCK_N] float32; ``acc`` [M, BLOCK_D] float32.
"""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import triton
import triton.language as tl

from impl.kernels.tl_ops import reduce_max, reduce_sum, tanh


@triton.jit
def block_scores(q, Q, K_buf, slots, kv_h, stride_kt, stride_kh, offs_d, mask_n, mask_d, sm_scale, logit_cap,
                 HAS_CAP: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_IEEE: tl.constexpr, KV_CONVERT: tl.constexpr):
    """q @ K[slots]^T * sm_scale (soft-capped with HAS_CAP): [M, BLOCK_N] float32, masked lanes not yet -inf."""
    k = tl.load(K_buf + slots[None, :] * stride_kt + kv_h * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
    if KV_CONVERT:
        k = k.to(Q.dtype.element_ty)  # fp8 (dequantised: the K scale is in sm_scale) or half precision
    if UPCAST_DOT:
        k = k.to(tl.float32)
    if DOT_IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = s * sm_scale
    if HAS_CAP:
        s = logit_cap * tanh(s / logit_cap)
    return s


@triton.jit
def online_softmax_step(s, m_i, l_i, acc, Q, V_buf, slots, kv_h, stride_vt, stride_vh, offs_d, mask_n, mask_d,
                        UPCAST_DOT: tl.constexpr, DOT_IEEE: tl.constexpr, KV_CONVERT: tl.constexpr):
    """Fold the masked scores ``s`` of one key block into the running max ``m_i``, sum ``l_i`` and output ``acc``;
    returns the three updated."""
    m_new = tl.maximum(m_i, reduce_max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + reduce_sum(p, 1)
    v = tl.load(V_buf + slots[:, None] * stride_vt + kv_h * stride_vh + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
    if KV_CONVERT:
        v = v.to(Q.dtype.element_ty)  # fp8: the V scale multiplies the output
    p = p.to(v.dtype)  # P @ V in the input dtype (bf16 on GPU tensor cores), fp32 accumulation
    if UPCAST_DOT:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    if DOT_IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l_i, acc
