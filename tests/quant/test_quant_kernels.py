"""The quantized linear kernels (impl/kernels/cpu_fused/quant_linear.cpp) against the torch reference
(impl/quant/reference.py), for every format, row count and both kernel routes (row kernel, dequantized GEMM)."""

from __future__ import annotations

import pytest
import torch

from impl.kernels import cpu_fused
from impl.quant import pack, reference
from impl.quant.base import WeightFormat, format_of

FORMATS = [WeightFormat("w8a8"), WeightFormat("w8a16"), WeightFormat("w4a16", 32), WeightFormat("w4a16", 128, False)]
IDS = ["w8a8", "w8a16", "w4a16-g32-sym", "w4a16-g128-asym"]


@pytest.fixture(scope="module")
def ext():
    e = cpu_fused.load()
    if e is None:
        pytest.skip(f"fused CPU kernels unavailable: {cpu_fused.error()}")
    return e


# (M, K, N): small weights (row kernel at every row count), a weight above the small-weight floor (the
# dequantized GEMM above 16 rows), an output count that leaves a row-block tail
SHAPES = [(1, 128, 96), (3, 256, 130), (16, 256, 67), (17, 512, 200), (40, 256, 257)]


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_kernel_matches_reference(ext, fmt, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + n)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(m, k, generator=g)
    p = pack.pack(w, fmt)
    found = format_of(p, k)
    assert found is not None and (found.kind, found.group_size) == (fmt.kind, fmt.group_size)
    assert torch.equal(ext.quant_dequant(p, k), reference.dequantize(p, k))
    ref, got = reference.linear(x, p), ext.quant_linear(x, p)
    if fmt.kind == "w8a8":
        assert torch.equal(got, ref)  # exact integer dot products, the same epilogue
    else:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    # bf16 activations are widened first (exactly)
    torch.testing.assert_close(ext.quant_linear(x.bfloat16(), p), reference.linear(x.bfloat16().float(), p), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_rows_do_not_depend_on_the_call(ext, fmt):
    """A row's result is the same alone, among 16 rows, and among 40 (the cross-decoder with and without fast
    prefill): exact for W8A8; for the weight-only kinds on weights under the small-weight floor."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(96, 128, generator=g), torch.randn(40, 128, generator=g)
    p = pack.pack(w, fmt)
    full = ext.quant_linear(x, p)
    for rows in (slice(0, 1), slice(5, 21), slice(3, 5)):
        assert torch.equal(ext.quant_linear(x[rows], p), full[rows])


def test_quantize_rows_matches_reference(ext):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(33, 96, generator=g) * torch.logspace(-3, 3, 33)[:, None]
    x[4] = 0.0  # an all-zero row: zero codes, zero scale
    q, s = ext.quantize_rows(x)
    rq, rs = reference.quantize_rows(x)
    assert torch.equal(q, rq) and torch.equal(s, rs)
    assert int(q.abs().max()) == 127 and float(s[4]) == 0.0


def test_quantization_error_is_small():
    """The packed formats hold the weights to their precision: int8 per channel ~0.4% of a row's range, int4 in
    groups ~7%."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    for fmt, bound in [(WeightFormat("w8a16"), 0.005), (WeightFormat("w4a16", 32), 0.08),
                       (WeightFormat("w4a16", 32, False), 0.08)]:
        err = (reference.dequantize(pack.pack(w, fmt), 256) - w).abs().amax(dim=1) / w.abs().amax(dim=1)
        assert float(err.max()) < bound, fmt


def test_bad_layouts_are_refused(ext):
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.quant_linear(torch.randn(2, 48), pack.pack(torch.randn(8, 64), WeightFormat("w8a16")))
    bad = torch.zeros(8, 1, 50, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="B = g \\+ 4"):
        ext.quant_linear(x, bad)
    with pytest.raises(ValueError, match="cannot take"):
        pack.pack(torch.randn(8, 48), WeightFormat("w8a8"))
