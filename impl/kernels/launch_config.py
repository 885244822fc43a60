"""Launch parameters per device.

Under the interpreter (CPU) each Triton op of each program instance costs ~0.1 ms
of Python whatever the block size, so CPU blocks are large (few programs, few
loop steps) and decode does not split the keys (no second launch). Tests that
need block boundaries pass small launches explicitly. On CUDA the blocks are
sized so the Q tile, a K and a V tile fit shared memory for head_dim up to 512.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

import torch

from impl.kernels.triton_env import TRITON_INTERPRETED


@dataclass(frozen=True)
class ExtendLaunch:
    block_m: int  # lanes per program: query rows x the query heads of one KV group
    block_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class DecodeLaunch:
    block_h: int  # query heads of one KV group per program (padded)
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class KVSplitPolicy:
    max_kv_splits: int  # upper bound on splits of one request's key range
    min_split_tokens: int  # do not split a range into pieces shorter than this


def block_d(head_dim: int) -> int:
    """head_dim padded to a power of two (masked lanes load 0)."""
    return max(16, triton.next_power_of_2(head_dim))


def extend_launch(head_dim: int, dtype: torch.dtype = torch.bfloat16, interpreted: bool = TRITON_INTERPRETED) -> ExtendLaunch:
    if interpreted:
        return ExtendLaunch(block_m=128, block_n=128, num_warps=1, num_stages=1)
    d = block_d(head_dim)
    # fp32 tiles are twice the bytes: halve the query rows. Shared memory stays under the A100
    # limit (163 KB) for every head_dim and dtype (tests/kernels/test_cuda_compile.py compiles for sm_90).
    wide = dtype == torch.float32
    if d <= 128:
        return ExtendLaunch(block_m=64 if wide else 128, block_n=64, num_warps=8, num_stages=2)
    if d <= 256:
        return ExtendLaunch(block_m=32 if wide else 64, block_n=32, num_warps=8, num_stages=2)
    return ExtendLaunch(block_m=16 if wide else 32, block_n=32, num_warps=8, num_stages=1)


def decode_launch(head_dim: int, group: int, dtype: torch.dtype = torch.bfloat16,
                  interpreted: bool = TRITON_INTERPRETED) -> DecodeLaunch:
    if interpreted:
        return DecodeLaunch(block_h=triton.next_power_of_2(group), block_n=128, num_warps=1, num_stages=1)
    d = block_d(head_dim)
    # tl.dot needs at least 16 rows: pad the head group to 16.
    return DecodeLaunch(
        block_h=max(16, triton.next_power_of_2(group)),
        block_n=(64 if d <= 256 else 32) // (2 if dtype == torch.float32 else 1),
        num_warps=4,
        num_stages=2,
    )


def kv_split_policy(interpreted: bool = TRITON_INTERPRETED) -> KVSplitPolicy:
    # CPU: one split (parallelism buys nothing interpreted); CUDA: splits long enough to amortise stage 2.
    return KVSplitPolicy(max_kv_splits=1, min_split_tokens=1 << 30) if interpreted else KVSplitPolicy(16, 256)
