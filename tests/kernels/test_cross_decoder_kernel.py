"""YOCO back half at kernel level: selected rows as queries over their requests' full context."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.kernels.decode_attention import decode_attention_fwd
from impl.kernels.extend_attention import extend_attention_fwd
from tests.helpers.kernel_cases import DEVICE, EXTEND_LAUNCHES, assert_close_to_truth, make_case


def extend(case, launch=None):
    return extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr,
                                case.q_positions, case.kv_indptr, case.kv_indices, case.max_q_len, case.scaling,
                                case.window, case.logit_cap, launch=launch)


@st.composite
def selections(draw):
    batch = draw(st.integers(1, 3))
    prefix = [draw(st.integers(0, 12)) for _ in range(batch)]
    ext = [draw(st.integers(1, 12)) for _ in range(batch)]
    # Every request keeps its last row (the sampled one) plus any others (prompt-logprob rows).
    rows = [sorted(set(draw(st.lists(st.integers(0, e - 1), max_size=3))) | {e - 1}) for e in ext]
    return dict(prefix_lens=prefix, extend_lens=ext, num_kv_heads=1, num_heads=2, head_dim=draw(st.sampled_from([32, 80])),
                dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])), seed=draw(st.integers(0, 999)),
                window=draw(st.one_of(st.none(), st.integers(1, 16)))), rows, draw(st.sampled_from(EXTEND_LAUNCHES))


@settings(max_examples=12, deadline=None, derandomize=True)  # fixed examples: a red CI reproduces
@given(selections())
@pytest.mark.slow  # Triton interpreter
def test_selected_rows_equal_the_full_pass_at_those_rows(shape_rows):
    shape, rows, launch = shape_rows
    case = make_case(**shape)
    full = extend(case, launch)
    sel = case.select(rows)
    part = extend(sel, launch)
    assert_close_to_truth(part, sel, shape["dtype"])
    starts = case.qo_indptr.tolist()
    idx = torch.tensor([starts[b] + r for b, rs in enumerate(rows) for r in rs], device=DEVICE)
    # Same keys, same block walk: equal up to the matmul's summation order (and one output rounding in bf16).
    tol = 1e-5 if shape["dtype"] == torch.float32 else 2.0**-7 * float(full.float().abs().max())
    torch.testing.assert_close(part.float(), full[idx].float(), rtol=0, atol=tol)


def test_last_rows_through_decode_kernel_match_extend():
    """One selected row per request (the usual back half) may run on the split-KV decode kernel."""
    case = make_case([5, 0, 30], [7, 4, 2], 4, 2, 64, torch.float32, seed=11, window=6)
    last = case.select([[6], [3], [1]])
    splits = torch.tensor([2, 1, 4], dtype=torch.int32, device=DEVICE)
    dec = decode_attention_fwd(last.q, torch.empty_like(last.q), last.k_buf, last.v_buf, last.q_positions,
                               last.kv_indptr, last.kv_indices, splits, 4, 1.0, 6)
    torch.testing.assert_close(dec, extend(last), rtol=1e-5, atol=1e-5)
    assert_close_to_truth(dec, last, torch.float32)
