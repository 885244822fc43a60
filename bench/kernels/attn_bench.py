"""Shapes, work counts and timers for the attention-kernel micro-benchmarks (shared by report.py and pytest-benchmark).

Work model: an attention row at position p that sees n keys costs 4 * n * head_dim
FLOPs per head (QK^T and PV, 2 per multiply-add). Bytes are the minimum traffic:
every visible K/V row of each KV head read once (decode reads the whole window of
each request), plus q, o and the kv_indices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import impl.kernels.triton_env  # noqa: F401  (TRITON_INTERPRET before any kernel is defined)

import torch
import torch.nn.functional as F

from impl.kernels.decode_attention import decode_attention_fwd, num_kv_splits_for
from impl.kernels.extend_attention import extend_attention_fwd
from impl.kernels.launch_config import kv_split_policy

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    q_len: int  # query rows per request (1 = decode)
    kv_len: int  # keys per request (the query rows are the last q_len of them)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None
    dtype: torch.dtype = torch.bfloat16


def shapes() -> list[Shape]:
    if not CUDA:  # interpreter: a smoke-sized run only
        return [Shape("extend-tiny", 1, 32, 32, 2, 1, 64, None, torch.float32),
                Shape("decode-tiny", 2, 1, 32, 2, 1, 64, None, torch.float32)]
    # Gemma-4 E2B attention: 8 heads, 1 KV head; sliding layers head_dim 256 / window 512, full layers 512.
    return [
        Shape("extend sliding d256 W512", 1, 4096, 4096, 8, 1, 256, 512),
        Shape("extend full d256", 1, 4096, 4096, 8, 1, 256, None),
        Shape("extend full d512", 1, 4096, 4096, 8, 1, 512, None),
        Shape("decode full d256", 32, 1, 4096, 8, 1, 256, None),
        Shape("decode full d512", 32, 1, 4096, 8, 1, 512, None),
        Shape("decode sliding d256 W512", 32, 1, 4096, 8, 1, 256, 512),
    ]


def visible_keys(s: Shape) -> int:
    """Keys seen by all query rows of one request."""
    total = 0
    for p in range(s.kv_len - s.q_len, s.kv_len):
        total += min(p + 1, s.window) if s.window else p + 1
    return total


def flops(s: Shape) -> float:
    return 4.0 * s.batch * visible_keys(s) * s.num_heads * s.head_dim


def min_bytes(s: Shape) -> float:
    elem = torch.tensor([], dtype=s.dtype).element_size()
    keys = s.kv_len if s.q_len > 1 else min(s.kv_len, s.window or s.kv_len)
    kv = 2 * keys * s.num_kv_heads * s.head_dim * elem + 8 * keys
    qo = 2 * s.q_len * s.num_heads * s.head_dim * elem
    return float(s.batch * (kv + qo))


class Problem:
    """A paged problem for our kernels and the same data laid out contiguously for SDPA."""

    def __init__(self, s: Shape):
        g = torch.Generator(device=DEVICE).manual_seed(0)
        self.s = s
        n = s.batch * s.kv_len
        mk = lambda *shape: torch.randn(*shape, generator=g, device=DEVICE, dtype=torch.float32).to(s.dtype)  # noqa: E731
        self.k_buf, self.v_buf = mk(n + 1, s.num_kv_heads, s.head_dim), mk(n + 1, s.num_kv_heads, s.head_dim)
        self.q = mk(s.batch * s.q_len, s.num_heads, s.head_dim) * s.head_dim**-0.5
        self.o = torch.empty_like(self.q)
        self.kv_indices = torch.randperm(n, generator=g, device=DEVICE) + 1  # scattered slots (slot 0 = pad)
        ar = torch.arange(s.batch + 1, device=DEVICE, dtype=torch.int32)
        self.kv_indptr = ar * s.kv_len
        self.qo_indptr = ar * s.q_len
        self.positions = (torch.arange(s.kv_len - s.q_len, s.kv_len, device=DEVICE).repeat(s.batch))
        splits = num_kv_splits_for([s.kv_len] * s.batch, s.num_kv_heads, kv_split_policy(),
                                   torch.cuda.get_device_properties(DEVICE).multi_processor_count if CUDA else None)
        self.num_kv_splits = torch.tensor(splits, dtype=torch.int32, device=DEVICE)
        self.max_kv_splits = max(splits)
        # SDPA: [B, H, L, D] contiguous copies of the same keys.
        idx = self.kv_indices.view(s.batch, s.kv_len)
        self.k_sdpa = self.k_buf[idx].transpose(1, 2).contiguous()
        self.v_sdpa = self.v_buf[idx].transpose(1, 2).contiguous()
        self.q_sdpa = self.q.view(s.batch, s.q_len, s.num_heads, s.head_dim).transpose(1, 2).contiguous()

    def ours(self) -> torch.Tensor:
        s = self.s
        if s.q_len == 1:
            return decode_attention_fwd(self.q, self.o, self.k_buf, self.v_buf, self.positions, self.kv_indptr,
                                        self.kv_indices, self.num_kv_splits, self.max_kv_splits, 1.0, s.window)
        return extend_attention_fwd(self.q, self.o, self.k_buf, self.v_buf, self.qo_indptr, self.positions,
                                    self.kv_indptr, self.kv_indices, s.q_len, 1.0, s.window)

    def sdpa(self) -> torch.Tensor | None:
        """torch SDPA on contiguous K/V (no window: SDPA has no sliding-window fast path)."""
        s = self.s
        if s.window is not None:
            return None
        return F.scaled_dot_product_attention(self.q_sdpa, self.k_sdpa, self.v_sdpa, is_causal=s.q_len > 1 and
                                              s.q_len == s.kv_len, scale=1.0, enable_gqa=s.num_heads != s.num_kv_heads)


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def time_ms(fn, warmup: int = 3, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e3 / iters
