"""Random paged-attention cases and the tolerance rule shared by the kernel tests.

Tolerance (stated once, used everywhere): a kernel run in ``dtype`` is compared
with the *true* result (the reference in float32 for bf16 inputs, in float64 for
float32 inputs) and may differ by

    tol = 4 * max|ref_low - ref_true| + eps(dtype) * max|ref_true|

where ``ref_low`` is the same reference computed entirely in ``dtype`` (its own
low-precision error: a kernel is allowed a small multiple of it) and the second
term covers rounding the output: eps(bf16) = 2^-7, one bf16 ulp (the interpreter
rounds by truncation); eps(fp32) = 2^-18 (32 ulps: a different summation order
over up to ~100 keys). Measured over 120 random cases: bf16 kernel error <=
0.15 * ref error + eps, fp32 <= 2.9 * ref error + 2^-23 * scale. A wrong mask
(one key too many or too few) moves outputs by ~0.1, far above either bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from impl.kernels.launch_config import DecodeLaunch, ExtendLaunch
from impl.kernels.reference import attention_ref
from impl.kernels.triton_env import TRITON_INTERPRETED

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-18}
TRUE_DTYPE = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}
K_REF = 4.0
# Extend launches the tests draw: the device default, and (interpreted only: tl.dot on GPUs needs >= 16)
# small blocks so a few dozen tokens span several query and key blocks.
EXTEND_LAUNCHES = [None] + ([ExtendLaunch(8, 8, 1, 1), ExtendLaunch(16, 8, 1, 1)] if TRITON_INTERPRETED else [])
DECODE_LAUNCHES = [None] + ([DecodeLaunch(1, 8, 1, 1)] if TRITON_INTERPRETED else [])  # block_h grows to the group


@dataclass
class PagedCase:
    q: torch.Tensor  # [Tq, H, D]
    k_buf: torch.Tensor  # [capacity, KVH, D]
    v_buf: torch.Tensor
    qo_indptr: torch.Tensor  # [B + 1] int32
    q_positions: torch.Tensor  # [Tq] int64
    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_indices: torch.Tensor  # [sum seq] int64
    q_lens: list[int]
    seq_lens: list[int]
    scaling: float
    window: int | None
    logit_cap: float | None

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens, default=0)

    def reference(self, compute_dtype: torch.dtype) -> torch.Tensor:
        return attention_ref(self.q, self.k_buf, self.v_buf, self.qo_indptr, self.q_positions, self.kv_indptr,
                             self.kv_indices, self.scaling, self.window, self.logit_cap, compute_dtype)

    def select(self, rows_per_req: list[list[int]]) -> "PagedCase":
        """The YOCO back half: only the given rows (offsets within each request's queries) stay queries."""
        starts = self.qo_indptr.tolist()
        rows = [starts[b] + r for b, rs in enumerate(rows_per_req) for r in rs]
        idx = torch.tensor(rows, dtype=torch.long, device=self.q.device)
        return PagedCase(self.q[idx], self.k_buf, self.v_buf, indptr([len(r) for r in rows_per_req]),
                         self.q_positions[idx], self.kv_indptr, self.kv_indices, [len(r) for r in rows_per_req],
                         self.seq_lens, self.scaling, self.window, self.logit_cap)


def indptr(lens: list[int]) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def make_case(prefix_lens: list[int], extend_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, seed: int, scaling: float = 1.0, window: int | None = None,
              logit_cap: float | None = None, spare_slots: int = 5) -> PagedCase:
    """Requests with a cached prefix plus new rows; KV slots scattered at random over the pool (slot 0 unused)."""
    g = torch.Generator().manual_seed(seed)
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    capacity = 1 + sum(seq) + spare_slots
    slots = (torch.randperm(capacity - 1, generator=g) + 1)[: sum(seq)]
    k_buf = torch.randn(capacity, num_kv_heads, head_dim, generator=g)
    v_buf = torch.randn(capacity, num_kv_heads, head_dim, generator=g)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=g)
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens)]) if extend_lens else \
        torch.zeros(0, dtype=torch.long)
    to = lambda t: t.to(dtype).to(DEVICE)  # noqa: E731
    return PagedCase(to(q), to(k_buf), to(v_buf), indptr(extend_lens), positions.to(DEVICE), indptr(seq),
                     slots.to(DEVICE), list(extend_lens), seq, scaling, window, logit_cap)


def draw_extend_shape(draw: Callable[[Any], Any], head_dims: list[int], longest_of: Callable[[int], int],
                      group_sizes: list[int]) -> dict[str, Any]:
    """make_case's keyword arguments for one extend batch, drawn through Hypothesis' ``draw``: 1-3 requests of
    prefix 0..longest and extend 1..longest rows (``longest_of(head_dim)``), GQA groups from ``group_sizes``."""
    from hypothesis import strategies as st

    head_dim = draw(st.sampled_from(head_dims))
    longest = longest_of(head_dim)
    batch = draw(st.integers(1, 3))
    return dict(
        prefix_lens=[draw(st.integers(0, longest)) for _ in range(batch)],
        extend_lens=[draw(st.integers(1, longest)) for _ in range(batch)],
        num_kv_heads=(kvh := draw(st.sampled_from([1, 2]))),
        num_heads=kvh * draw(st.sampled_from(group_sizes)),
        head_dim=head_dim,
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
        scaling=draw(st.sampled_from([1.0, head_dim**-0.5])),
        window=draw(st.one_of(st.none(), st.integers(1, 2 * longest + 2))),
        logit_cap=draw(st.sampled_from([None, 5.0])),
    )


def tolerance(case: PagedCase, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(truth, tol) by the rule in the module docstring."""
    truth = case.reference(TRUE_DTYPE[dtype])
    low = case.reference(dtype)
    scale = float(truth.abs().max()) if truth.numel() else 0.0
    tol = K_REF * float((low.to(truth.dtype) - truth).abs().max() if truth.numel() else 0.0) + EPS[dtype] * scale
    return truth, tol + 1e-12


def assert_close_to_truth(out: torch.Tensor, case: PagedCase, dtype: torch.dtype) -> None:
    truth, tol = tolerance(case, dtype)
    err = float((out.to(truth.dtype) - truth).abs().max()) if truth.numel() else 0.0
    assert err <= tol, f"kernel error {err:.3g} exceeds tolerance {tol:.3g} (dtype {dtype})"


# AMX's flags as /proc/cpuinfo names them: what IMPL_CPU_AMX_EMULATE builds run in software
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})


def kernel_cpu_flags() -> set[str]:
    """The CPU flags the C++ extensions' builds see: ``/proc/cpuinfo``'s, plus AMX's where ``IMPL_CPU_AMX_EMULATE``
    builds the tiles in software (``make test-amx-emulated``), so the tests expect the AMX paths there."""
    from bench.machine import cpu_flags
    from impl.envs import envs

    flags = cpu_flags()
    return flags | AMX_FLAGS if envs.IMPL_CPU_AMX_EMULATE.get() else flags
