"""fp8 KV pools (float8_e4m3fn / float8_e5m2 with a per-layer K / V scale) in every attention kernel.

The kernels dequantise in the kernel (element times scale, float32 accumulation), so with power-of-two
scales (exact in every dtype) an fp8 pool must give what the same kernel gives on the dequantised pool,
and both what the float64 reference gives on it (tolerance rule: kernel_cases). Gemma-4's two head dims
(256 sliding, 512 full) both run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from impl.kernels import cpu_attn
from impl.kernels.decode_attention import decode_attention_fwd as triton_decode
from impl.kernels.extend_attention import extend_attention_fwd as triton_extend
from impl.kernels.reference import rows_attention_ref
from tests.helpers.kernel_cases import assert_close_to_truth, make_case

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
K_SCALE, V_SCALE = 0.5, 2.0  # powers of two: dequantised values are exact in bf16 and float32

needs_cpu_kernels = pytest.mark.skipif(cpu_attn.load() is None or torch.cuda.is_available(),
                                       reason=f"CPU attention extension unavailable: {cpu_attn.error()}")


def fp8_pair(case, fmt):
    """(case with an fp8 pool, the same case with that pool dequantised into q's dtype)."""
    k8 = (case.k_buf.float() / K_SCALE).to(fmt)
    v8 = (case.v_buf.float() / V_SCALE).to(fmt)
    deq = dataclasses.replace(case, k_buf=(k8.float() * K_SCALE).to(case.q.dtype),
                              v_buf=(v8.float() * V_SCALE).to(case.q.dtype))
    return dataclasses.replace(case, k_buf=k8, v_buf=v8), deq


def extend(fn, case, scales=(1.0, 1.0)):
    return fn(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr, case.q_positions,
              case.kv_indptr, case.kv_indices, case.max_q_len, case.scaling, case.window, case.logit_cap, *scales)


def decode(fn, case, splits, scales=(1.0, 1.0)):
    n = torch.tensor(splits, dtype=torch.int32, device=case.q.device)
    return fn(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.q_positions, case.kv_indptr,
              case.kv_indices, n, max(splits), case.scaling, case.window, case.logit_cap, *scales)


@needs_cpu_kernels
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,window", [(256, 40), (512, None), (80, 7)])
def test_cpu_kernels_read_fp8_pools(fmt, dtype, head_dim, window):
    """Extend (a mixed batch with a cached prefix) and split-KV decode over an fp8 pool."""
    case = make_case([70, 0, 5], [3, 45, 1], 8, 1, head_dim, dtype, seed=head_dim, window=window, logit_cap=30.0)
    f8, deq = fp8_pair(case, fmt)
    got = extend(cpu_attn.extend_attention_fwd, f8, (K_SCALE, V_SCALE))
    assert_close_to_truth(got, deq, dtype)
    torch.testing.assert_close(got, extend(cpu_attn.extend_attention_fwd, deq), rtol=0, atol=1e-6)
    last = f8.select([[2], [44], [0]])
    got = decode(cpu_attn.decode_attention_fwd, last, [3, 2, 1], (K_SCALE, V_SCALE))
    last_deq = deq.select([[2], [44], [0]])
    assert_close_to_truth(got, last_deq, dtype)
    torch.testing.assert_close(got, decode(cpu_attn.decode_attention_fwd, last_deq, [3, 2, 1]), rtol=0, atol=1e-6)


@needs_cpu_kernels
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim,window", [(256, 9), (512, 0)])
def test_rows_attention_reads_fp8_pools_through_a_slot_map(fmt, head_dim, window):
    """torch_native's kernel: fp8 rows dequantised in the kernel, slots mapped through a slot map (the hybrid
    pool's sliding layers) or read directly."""
    g = torch.Generator().manual_seed(head_dim)
    slots, reqs, ctx = 90, 3, 40
    k = (torch.randn(slots, 1, head_dim, generator=g) / K_SCALE).to(fmt)
    v = (torch.randn(slots, 1, head_dim, generator=g) / V_SCALE).to(fmt)
    r2t = torch.randint(1, 200, (reqs, ctx), generator=g)  # "full" slots, mapped into the 90-row buffers
    slot_map = torch.randint(0, slots, (200,), generator=g)
    row_req, q_pos = torch.tensor([0, 2, 2, 2, 1]), torch.tensor([39, 10, 11, 12, 0])
    q = torch.randn(5, 4, head_dim, generator=g)
    got = cpu_attn.rows_attention(q, k, v, r2t, row_req, q_pos, window, 1.0, 0.0, K_SCALE, V_SCALE, slot_map)
    want = rows_attention_ref(q.double(), k, v, r2t, row_req, q_pos, window, 1.0, 0.0, K_SCALE, V_SCALE, slot_map)
    assert float((got.double() - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
    direct = cpu_attn.rows_attention(q, k, v, slot_map[r2t], row_req, q_pos, window, 1.0, 0.0, K_SCALE, V_SCALE)
    torch.testing.assert_close(got, direct, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_read_fp8_pools(fmt, dtype):
    """The Triton extend and decode kernels on fp8 pools (compiled on CUDA, under the interpreter on CPU), both
    head dims."""
    for head_dim in (256, 512):
        case = make_case([6, 0], [3, 9], 4, 1, head_dim, dtype, seed=head_dim + 1, window=5 if head_dim == 256 else None)
        f8, deq = fp8_pair(case, fmt)
        assert_close_to_truth(extend(triton_extend, f8, (K_SCALE, V_SCALE)), deq, dtype)
        last, last_deq = f8.select([[2], [8]]), deq.select([[2], [8]])
        assert_close_to_truth(decode(triton_decode, last, [2, 3], (K_SCALE, V_SCALE)), last_deq, dtype)


def test_fp8_launches_refuse_mismatched_dtypes_and_bad_scales():
    case = make_case([3], [2], 2, 1, 16, torch.float32, seed=1)
    f8, _ = fp8_pair(case, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="v_buf"):
        triton_extend(f8.q, torch.empty_like(f8.q), f8.k_buf, f8.v_buf.to(torch.float8_e5m2), f8.qo_indptr,
                      f8.q_positions, f8.kv_indptr, f8.kv_indices, 2, 1.0)
    with pytest.raises(ValueError, match="KV scales must be positive"):
        extend(triton_extend, f8, (0.0, 1.0))


@needs_cpu_kernels
@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16])
def test_float32_queries_read_half_precision_pools(pool_dtype):
    """torch_native's rows kernel on a float32 model with --kv-cache-dtype bf16: the pool converts in the kernel."""
    case = make_case([20, 0], [2, 17], 8, 1, 256, torch.float32, seed=2, window=9)
    half = dataclasses.replace(case, k_buf=case.k_buf.to(pool_dtype), v_buf=case.v_buf.to(pool_dtype))
    deq = dataclasses.replace(case, k_buf=half.k_buf.float(), v_buf=half.v_buf.float())
    got = extend(cpu_attn.extend_attention_fwd, half)
    assert_close_to_truth(got, deq, torch.float32)
    torch.testing.assert_close(got, extend(cpu_attn.extend_attention_fwd, deq), rtol=0, atol=1e-6)
