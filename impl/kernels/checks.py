"""Host-side precondition checks shared by the kernel launchers."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# K/V pools may also store fp8 (read with a per-layer scale: stored = value / scale), and float32 queries
# may read bfloat16 / float16 pools; the kernels convert K/V tiles to q's dtype as they load them.
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 512


# The checks below run on every kernel launch (35 a decode step of E2B): each condition is tested first and its
# message formatted only when it fails (formatting every message eagerly cost ~35 us a launch).


def check_attention_args(q, o, k_buf, v_buf, name: str) -> None:
    """q/o: [n, H, D]; k_buf/v_buf: [capacity, KVH, D]; innermost dim contiguous; one dtype."""
    if not (q.dim() == 3 and o.shape == q.shape):
        raise ValueError(f"{name}: q and o must be [tokens, heads, head_dim] of one shape, "
                         f"got q {tuple(q.shape)} o {tuple(o.shape)}")
    if not (k_buf.dim() == 3 and v_buf.shape == k_buf.shape):
        raise ValueError(f"{name}: K/V buffers must be [capacity, kv_heads, head_dim] of one shape, "
                         f"got {tuple(k_buf.shape)} and {tuple(v_buf.shape)}")
    h, d = q.shape[1], q.shape[2]
    kvh = k_buf.shape[1]
    if k_buf.shape[2] != d:
        raise ValueError(f"{name}: head_dim of q ({d}) and of the K/V buffers ({k_buf.shape[2]}) differ")
    if not (kvh > 0 and h % kvh == 0):
        raise ValueError(f"{name}: num_heads {h} must be a multiple of num_kv_heads {kvh} (GQA)")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head_dim {d} outside the supported {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: dtype {q.dtype} unsupported; use float32, bfloat16 or float16")
    if o.dtype != q.dtype:
        raise ValueError(f"{name}: o dtype {o.dtype} differs from q dtype {q.dtype}; cast one of them")
    if v_buf.dtype != k_buf.dtype:
        raise ValueError(f"{name}: k_buf is {k_buf.dtype} but v_buf {v_buf.dtype}; one pool dtype")
    half_pool = q.dtype == torch.float32 and k_buf.dtype in (torch.bfloat16, torch.float16)
    if not (k_buf.dtype == q.dtype or k_buf.dtype in FP8_KV_DTYPES or half_pool):
        raise ValueError(f"{name}: K/V buffer dtype {k_buf.dtype} differs from q dtype {q.dtype}; the pool holds q's "
                         "dtype, fp8 (float8_e4m3fn / float8_e5m2), or bfloat16 / float16 under float32 queries")
    for t, n in ((o, "o"), (k_buf, "k_buf"), (v_buf, "v_buf")):
        if t.device != q.device:
            raise ValueError(f"{name}: {n} is on {t.device}, q on {q.device}")
    for t, n in ((q, "q"), (o, "o"), (k_buf, "k_buf"), (v_buf, "v_buf")):
        if t.stride(2) != 1:
            raise ValueError(f"{name}: {n} must be contiguous in head_dim (stride {t.stride(2)}); call .contiguous()")


def check_index(t: torch.Tensor, n: int | None, name: str, what: str, device) -> None:
    if t.dim() != 1:
        raise ValueError(f"{name}: {what} must be 1-D, got shape {tuple(t.shape)}")
    if t.is_floating_point():
        raise ValueError(f"{name}: {what} must be an integer tensor, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: {what} is on {t.device}, expected {device}")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"{name}: {what} must have {n} entries, got {t.shape[0]}")


def _check_window_cap(name: str, window: int | None, logit_cap: float | None) -> None:
    if not (window is None or window > 0):
        raise ValueError(f"{name}: window must be positive or None, got {window}")
    if not (logit_cap is None or logit_cap >= 0):
        raise ValueError(f"{name}: logit_cap must be >= 0 or None, got {logit_cap}")


def check_kv_scales(name: str, k_scale: float, v_scale: float) -> None:
    if not (0 < k_scale < float("inf") and 0 < v_scale < float("inf")):
        raise ValueError(f"{name}: KV scales must be positive and finite, got k_scale={k_scale} v_scale={v_scale}")


def check_extend_launch(name: str, q, o, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices,
                        window: int | None, logit_cap: float | None, k_scale: float = 1.0, v_scale: float = 1.0) -> int:
    """Every extend provider's preconditions (Triton and CPU take one signature); returns the batch size."""
    check_attention_args(q, o, k_buf, v_buf, name)
    batch = qo_indptr.shape[0] - 1
    check_index(qo_indptr, None, name, "qo_indptr", q.device)
    check_index(kv_indptr, batch + 1, name, "kv_indptr", q.device)
    check_index(q_positions, q.shape[0], name, "q_positions", q.device)
    check_index(kv_indices, None, name, "kv_indices", q.device)
    _check_window_cap(name, window, logit_cap)
    check_kv_scales(name, k_scale, v_scale)
    return batch


def check_decode_launch(name: str, q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits,
                        max_kv_splits: int, window: int | None, logit_cap: float | None, k_scale: float = 1.0,
                        v_scale: float = 1.0) -> int:
    """Every decode provider's preconditions (one query row per request); returns the batch size."""
    check_attention_args(q, o, k_buf, v_buf, name)
    batch = q.shape[0]
    check_index(q_positions, batch, name, "q_positions", q.device)
    check_index(kv_indptr, batch + 1, name, "kv_indptr", q.device)
    check_index(kv_indices, None, name, "kv_indices", q.device)
    check_index(num_kv_splits, batch, name, "num_kv_splits", q.device)
    if max_kv_splits < 1:
        raise ValueError(f"{name}: max_kv_splits must be >= 1, got {max_kv_splits}")
    _check_window_cap(name, window, logit_cap)
    check_kv_scales(name, k_scale, v_scale)
    return batch
