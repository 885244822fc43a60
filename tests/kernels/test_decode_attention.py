"""Split-KV decode kernel vs the reference, and extend/decode agreement on the sliding window."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from impl.kernels.decode_attention import decode_attention_fwd, num_kv_splits_for
from impl.kernels.extend_attention import extend_attention_fwd
from impl.kernels.launch_config import KVSplitPolicy
from tests.helpers.kernel_cases import DECODE_LAUNCHES, DEVICE, assert_close_to_truth, make_case


def run_decode(case, splits: list[int], launch=None):
    o = torch.empty_like(case.q)
    n = torch.tensor(splits, dtype=torch.int32, device=DEVICE)
    return decode_attention_fwd(case.q, o, case.k_buf, case.v_buf, case.q_positions, case.kv_indptr, case.kv_indices,
                                n, max(splits), case.scaling, case.window, case.logit_cap, launch=launch)


@st.composite
def decode_shapes(draw):
    head_dim = draw(st.sampled_from([16, 64, 80, 256, 512]))
    longest = 6 if head_dim >= 256 else 40
    batch = draw(st.integers(1, 3))
    return dict(
        prefix_lens=[draw(st.integers(0, longest)) for _ in range(batch)],
        extend_lens=[1] * batch,
        num_kv_heads=(kvh := draw(st.sampled_from([1, 2]))),
        num_heads=kvh * draw(st.sampled_from([1, 3, 4])),
        head_dim=head_dim,
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
        scaling=draw(st.sampled_from([1.0, head_dim**-0.5])),
        window=draw(st.one_of(st.none(), st.integers(1, longest + 2))),
        logit_cap=draw(st.sampled_from([None, 5.0])),
    ), [draw(st.integers(1, 4)) for _ in range(batch)], draw(st.sampled_from(DECODE_LAUNCHES))


@settings(max_examples=25, deadline=None, derandomize=True)  # fixed examples: a red CI reproduces
@given(decode_shapes())
@example((dict(prefix_lens=[0, 30], extend_lens=[1, 1], num_kv_heads=2, num_heads=6, head_dim=80,
               dtype=torch.bfloat16, seed=1, scaling=1.0, window=None, logit_cap=None), [4, 4], None))  # > keys
@example((dict(prefix_lens=[25], extend_lens=[1], num_kv_heads=1, num_heads=1, head_dim=64,
               dtype=torch.float32, seed=2, scaling=1.0, window=5, logit_cap=30.0), [3], DECODE_LAUNCHES[-1]))
@pytest.mark.slow  # Triton interpreter over many shapes
def test_decode_matches_reference(shape_splits):
    shape, splits, launch = shape_splits
    case = make_case(**shape)
    assert_close_to_truth(run_decode(case, splits, launch), case, shape["dtype"])


def test_split_count_does_not_change_the_result():
    case = make_case([37, 12], [1, 1], 4, 2, 32, torch.float32, seed=7, window=20)
    one = run_decode(case, [1, 1])  # one split everywhere: stage 1 writes the output, no reduce
    for splits in ([2, 3], [4, 4], [1, 4]):
        torch.testing.assert_close(run_decode(case, splits, DECODE_LAUNCHES[-1]), one, rtol=1e-5, atol=1e-5)


def test_decode_and_extend_see_the_same_window():
    """SGLang's decode attends to W-1 keys where extend attends to W; here both see self and W-1 before."""
    for window in (1, 4, 9):
        case = make_case([20], [1], 2, 1, 32, torch.float32, seed=8, window=window)
        dec = run_decode(case, [3])
        ext = extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr,
                                   case.q_positions, case.kv_indptr, case.kv_indices, 1, 1.0, window)
        torch.testing.assert_close(dec, ext, rtol=1e-5, atol=1e-5)
        assert_close_to_truth(dec, case, torch.float32)


def test_num_kv_splits_policy():
    policy = KVSplitPolicy(max_kv_splits=4, min_split_tokens=8)
    assert num_kv_splits_for([1, 8, 9, 100], 1, policy, None) == [1, 1, 2, 4]
    # a device with few SMs and many requests gets no splitting
    assert num_kv_splits_for([100] * 8, 2, policy, num_sms=4) == [1] * 8
