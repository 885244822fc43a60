"""Extend kernel vs the pure-torch reference on hypothesis-drawn paged batches (tolerance: kernel_cases)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from impl.kernels.extend_attention import extend_attention_fwd
from tests.helpers.kernel_cases import EXTEND_LAUNCHES, assert_close_to_truth, draw_extend_shape, make_case


def run_extend(case, launch=None):
    o = torch.empty_like(case.q)
    return extend_attention_fwd(case.q, o, case.k_buf, case.v_buf, case.qo_indptr, case.q_positions, case.kv_indptr,
                                case.kv_indices, case.max_q_len, case.scaling, case.window, case.logit_cap, launch=launch)


@st.composite
def extend_shapes(draw):
    # big heads: very few tokens (the interpreter is slow)
    shape = draw_extend_shape(draw, [16, 32, 64, 80, 128, 256], lambda d: 5 if d >= 128 else 24, [1, 2, 3])
    return draw(st.sampled_from(EXTEND_LAUNCHES)), shape


@settings(max_examples=25, deadline=None, derandomize=True)  # fixed examples: a red CI reproduces
@given(extend_shapes())
@example((None, dict(prefix_lens=[0], extend_lens=[1], num_kv_heads=1, num_heads=2, head_dim=512, dtype=torch.bfloat16,
                     seed=1, scaling=1.0, window=None, logit_cap=None)))  # Gemma full-layer head_dim, one token
@example((None, dict(prefix_lens=[3, 0], extend_lens=[2, 3], num_kv_heads=1, num_heads=1, head_dim=512,
                     dtype=torch.float32, seed=2, scaling=1.0, window=2, logit_cap=30.0)))
@example((EXTEND_LAUNCHES[-1], dict(prefix_lens=[17, 0, 5], extend_lens=[1, 20, 1], num_kv_heads=2, num_heads=6,
                                    head_dim=80, dtype=torch.bfloat16, seed=3, scaling=1.0, window=7,
                                    logit_cap=None)))  # mixed batch with 1-token extends, GQA group 3
@pytest.mark.slow  # Triton interpreter over many shapes
def test_extend_matches_reference(launch_shape):
    launch, shape = launch_shape
    case = make_case(**shape)
    assert_close_to_truth(run_extend(case, launch), case, shape["dtype"])


def test_window_is_inclusive_of_self_and_w_minus_1_before():
    """W = 3: the query at position 9 sees keys 7, 8, 9; changing V at key 6 changes nothing, at key 7 it does."""
    case = make_case([9], [1], 1, 1, 16, torch.float32, seed=5, window=3)
    base = run_extend(case).clone()
    for key, should_change in ((6, False), (7, True)):
        slot = int(case.kv_indices[key])
        saved = case.v_buf[slot].clone()
        case.v_buf[slot] += 10.0
        changed = not torch.allclose(run_extend(case), base)
        case.v_buf[slot] = saved
        assert changed == should_change, f"key {key} {'should' if should_change else 'should not'} be visible"


def test_empty_batch_and_zero_rows_leave_output_untouched():
    case = make_case([4, 2], [3, 2], 2, 1, 32, torch.float32, seed=6)
    sel = case.select([[], [1]])  # request 0 has no query rows: its program must return early
    o = torch.full_like(sel.q, 7.0)
    extend_attention_fwd(sel.q, o, sel.k_buf, sel.v_buf, sel.qo_indptr, sel.q_positions, sel.kv_indptr,
                         sel.kv_indices, sel.max_q_len, 1.0)
    assert_close_to_truth(o, sel, torch.float32)
