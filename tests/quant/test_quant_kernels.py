"""The quantized linear kernels (impl/kernels/cpu_fused/quant_linear.cpp) against the torch reference
(impl/quant/reference.py), for every format, row count and both kernel routes (row kernel, dequantized GEMM)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.kernel_cases import kernel_cpu_flags
from impl.kernels import cpp_build, cpu_fused
from impl.quant import pack, reference
from impl.quant.base import WeightFormat, format_of

FORMATS = [WeightFormat("w8a8"), WeightFormat("w8a16"), WeightFormat("w4a16", 32), WeightFormat("w4a16", 128, False),
           WeightFormat("w4a8", 32), WeightFormat("w4a8", 64, False), WeightFormat("w4a8", 128, False), WeightFormat("w4a8", 256)]
IDS = ["w8a8", "w8a16", "w4a16-g32-sym", "w4a16-g128-asym", "w4a8-g32-sym", "w4a8-g64-asym", "w4a8-g128-asym",
       "w4a8-g256-sym"]


@pytest.fixture(scope="module")
def ext():
    e = cpu_fused.load()
    if e is None:
        pytest.skip(f"fused CPU kernels unavailable: {cpu_fused.error()}")
    return e


# (M, K, N): small weights (row kernel at every row count), a weight above the small-weight floor (the
# dequantized GEMM above 16 rows), an output count that leaves a row-block tail, and W8A8's AMX tiles (from 32
# rows, N a multiple of 32, K of 64; a partial 32-row block of x) where the CPU has them
SHAPES = [(1, 256, 96), (3, 256, 130), (16, 256, 67), (17, 512, 200), (40, 256, 257), (45, 256, 64)]


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
    else:  # W4A8: exact integer group sums, the reference sums the groups in float64
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    # bf16 activations are widened first (exactly)
    torch.testing.assert_close(ext.quant_linear(x.bfloat16(), p), reference.linear(x.bfloat16().float(), p), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_rows_do_not_depend_on_the_call(ext, fmt):
    """A row's result is the same alone, among 16 rows, and among 40 (the cross-decoder with and without fast
    prefill): exact for W8A8 and W4A8; for the weight-only kinds on weights under the small-weight floor."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(96, 256, generator=g), torch.randn(40, 256, generator=g)
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


def test_quantize_rows_exact_quotients(ext):
    """Codes next to every rounding boundary (x / s within a few ulps of k + 1/2) and at scales from 2^-130 to
    2^120: the kernel's x * (1 / s) with Markstein's correction (and its division outside the range where that is
    exact) gives the division's codes; a kernel that multiplied by 1 / s alone would miss some of these."""
    g = torch.Generator().manual_seed(3)
    amaxes = torch.cat([torch.tensor([2.0**-130, 2.0**-110, 2.0**-100, 2.0**-90, 2.0**100, 2.0**120, 1.0]),
                        torch.rand(57, generator=g) * 2.0 ** torch.randint(-60, 60, (57,), generator=g)])
    rows = []
    for amax in amaxes.tolist():
        s = torch.tensor(amax, dtype=torch.float32) / 127.0
        near = [(torch.arange(-127, 127, dtype=torch.float32) + 0.5) * s]  # [254] at each boundary
        for way in (float("inf"), float("-inf")):  # and 1 to 3 ulps either side
            v = near[0]
            for _ in range(3):
                v = torch.nextafter(v, torch.tensor(way))
                near.append(v)
        row = torch.cat(near)
        row[0] = amax  # the row's max |x| is amax: s as above
        rows.append(row)
    x = torch.stack(rows)
    q, sc = ext.quantize_rows(x)
    rq, rs = reference.quantize_rows(x)
    assert torch.equal(sc, rs) and torch.equal(q, rq)
    naive = torch.round(x * (1.0 / rs)[:, None]).clamp(-127, 127).to(torch.int8)
    assert not torch.equal(naive, rq), "the rows must hold quotients a plain reciprocal product rounds differently"


@pytest.mark.parametrize("fmt", [WeightFormat("w8a8"), WeightFormat("w4a8", 128, symmetric=False)], ids=WeightFormat.name)
@pytest.mark.parametrize("rows,inter", [(1, 96), (3, 96), (40, 96), (77, 4160)])  # row kernels; AMX tiles (W4A8 from 2)
def test_gate_up_activation_in_the_matmul_is_the_two_steps(ext, fmt, rows, inter):
    """A W8A8 or W4A8 gate / up weight [2I, K] with the MLP's activation in the matmul (fused into the AMX tiles'
    epilogue where the CPU has them, pairing gate and up columns): the same bits as the products, then
    gelu_tanh(gate) * up over each whole row, over partial row blocks and more than one chunk of packed blocks."""
    g = torch.Generator().manual_seed(7)
    w = pack.pack(torch.randn(2 * inter, 256, generator=g) * 0.1, fmt)
    x = torch.randn(rows, 256, generator=g) * 2
    gu = ext.quant_linear(x, w)
    y = ext.quant_gelu_mul(x, w)
    assert torch.equal(y, ext.gelu_mul(gu[:, :inter].contiguous(), gu[:, inter:].contiguous()))
    tiles_from = 32 if fmt.kind == "w8a8" else 2  # W4A8 decode of several requests takes the tiles too
    assert ext.quant_gelu_mul_fused(rows, w, 256) == (rows >= tiles_from and ext.quant_w8a8_prefill_isa() == "amx_int8")


@pytest.mark.parametrize("fmt", [WeightFormat("w8a8"), WeightFormat("w4a8", 128, symmetric=False)], ids=WeightFormat.name)
def test_quantized_mlp_gives_a_row_the_same_bits_in_any_batch(ext, fmt):
    """decoder_post with a quantized MLP: 40 rows take the AMX tiles where the CPU has them (the activation in
    the gate / up epilogue), 1-3 rows the row kernels and the two-pass activation; every row gets the same bits
    either way (fast prefill runs the cross-decoder on a handful of rows, the flag-off prefill on all)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    n, hid, hd, inter = 40, 256, 64, 256
    gate_up, down = pack.pack(r(2 * inter, hid), fmt), pack.pack(r(hid, inter), fmt)
    h, attn, o_w, norms = r(n, hid), r(n, hd), r(hid, hd), [r(hid) + 1 for _ in range(3)]
    post = lambda rows: ext.decoder_post(h[rows], attn[rows], o_w, norms[0], norms[1], [gate_up], down,  # noqa: E731
                                         norms[2], None, None, None, None, 0.625, 1e-6)
    whole = post(slice(0, n))
    for rows in (slice(0, 1), slice(5, 8), slice(39, 40)):
        assert torch.equal(post(rows), whole[rows]), rows


@pytest.mark.parametrize("rows", [3, 40])  # the row kernel; AMX tiles from 32 rows where the CPU has them
def test_fused_activation_quantization_is_the_two_steps(ext, rows):
    """decoder_post's W8A8 MLP quantizes gelu_tanh(gate) * up row by row as it computes it: the same codes and
    scales as the activation pass then quantize_rows, and the down projection on them the same bits as
    quant_linear on the activation."""
    g = torch.Generator().manual_seed(5)
    gate, up = torch.randn(rows, 2 * 96, generator=g)[:, :96] * 3, torch.randn(rows, 96, generator=g)
    gate[1, :5] = torch.tensor([-30.0, 0.0, float("inf"), -1e-30, 8.5])
    codes, scales = ext.gelu_mul_quantize(gate, up)
    y = ext.gelu_mul(gate, up)
    rq, rs = ext.quantize_rows(y)
    assert torch.equal(codes, rq) and torch.equal(scales, rs)
    w = pack.pack(torch.randn(64, 96, generator=g), WeightFormat("w8a8"))
    assert torch.equal(ext.w8a8_linear_codes(codes, scales, w), ext.quant_linear(y, w))


@pytest.mark.parametrize("rows", [333, 96])
@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_w4a8_rows_are_exact_at_every_size(ext, group, rows):
    """W4A8 takes exact integer dot products per group at every row count and weight size (decode's 4-row passes,
    prefill's 2 x 2 tiles, row-block tails; from 2 rows AMX-int8 tiles where the CPU has them, for groups of 128
    and 256 and weights of a multiple of 32 rows: one row block streamed, more unpacked first), and adds their
    terms in one order: a row's bits never depend on the call, even on a weight above the small-weight floor
    (where the weight-only kinds switch to the dequantized GEMM). Every group size: with VNNI, groups of 128 and
    256 take their own integer loop."""
    g = torch.Generator().manual_seed(5)
    p = pack.pack(torch.randn(rows, 512, generator=g), WeightFormat("w4a8", group, False))
    x = torch.randn(37, 512, generator=g)
    full = ext.quant_linear(x, p)
    for rows in (slice(0, 1), slice(36, 37), slice(1, 4), slice(10, 27)):
        assert torch.equal(ext.quant_linear(x[rows], p), full[rows])
    torch.testing.assert_close(full, reference.linear(x, p), rtol=1e-5, atol=1e-4)


def test_quantize_groups_matches_reference(ext):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(9, 256, generator=g) * torch.logspace(-3, 3, 9)[:, None]
    x[2, 128:] = 0.0  # an all-zero group: zero codes, zero scale, zero sum
    q, s, sums = ext.quantize_groups(x, 128)
    rq, rs, rsums = reference.quantize_groups(x, 128)
    assert torch.equal(q, rq) and torch.equal(s, rs) and torch.equal(sums, rsums)
    assert s.shape == (9, 2) and float(s[2, 1]) == 0.0 and int(sums[2, 1]) == 0


def test_w4a8_is_close_to_the_float_product():
    """W4A8 differs from W4A16 (the same codes) only by the activations' int8 rounding: well under 1% of the
    output's scale."""
    g = torch.Generator().manual_seed(7)
    w, x = torch.randn(64, 512, generator=g), torch.randn(8, 512, generator=g)
    p16, p8 = pack.pack(w, WeightFormat("w4a16", 128, False)), pack.pack(w, WeightFormat("w4a8", 128, False))
    assert torch.equal(p16.view(torch.int8), p8)  # the same bytes
    y16, y8 = reference.linear(x, p16), reference.linear(x, p8)
    assert float((y8 - y16).abs().max() / y16.abs().max()) < 0.01


def test_quantization_error_is_small(monkeypatch):
    """The packed formats hold the weights to their precision: int8 per channel ~0.4% of a row's range, int4 in
    groups over their min / max ~7% (the range search trades the largest errors for a smaller sum: below)."""
    monkeypatch.setenv("IMPL_QUANT_INT4_SEARCH", "0")
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    for fmt, bound in [(WeightFormat("w8a16"), 0.005), (WeightFormat("w4a16", 32), 0.08),
                       (WeightFormat("w4a16", 32, False), 0.08)]:
        err = (reference.dequantize(pack.pack(w, fmt), 256) - w).abs().amax(dim=1) / w.abs().amax(dim=1)
        assert float(err.max()) < bound, fmt


@pytest.mark.parametrize("g", [32, 128])
def test_int4_range_search_kernel_matches_its_reference_and_lowers_the_error(ext, monkeypatch, g):
    """Asymmetric int4's range search: the compiled kernel picks the reference's range for a group, or one whose
    squared error ties it within float32 summation order; the packed weight's error per group is never above
    the min / max range's (one of the candidates), and lower over the weight. Heavy-tailed rows (outliers) so
    the search has something to clip."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(48, 4 * g, generator=gen) * torch.rand(48, 1, generator=gen)
    w[torch.rand(w.shape, generator=gen) < 0.02] *= 6.0
    wg = w.view(48, 4, g)
    got, want = ext.int4_range_choices(w.contiguous(), g).long(), reference.int4_range_choices(wg)
    assert float((got == want).float().mean()) > 0.95 and bool((got != 0).any())

    def group_err(idx):
        n_s = len(reference.INT4_RANGE_SCALES)
        sc = torch.tensor(reference.INT4_RANGE_SCALES)
        lo = wg.amin(dim=2, keepdim=True).clamp(max=0.0) * sc[idx // n_s].unsqueeze(-1)
        hi = wg.amax(dim=2, keepdim=True).clamp(min=0.0) * sc[idx % n_s].unsqueeze(-1)
        s = (hi - lo) / 15.0
        z = torch.round(-lo / s).clamp(0, 15)
        return ((s * ((torch.round(wg / s) + z).clamp(0, 15) - z) - wg) ** 2).double().sum(dim=2)

    torch.testing.assert_close(group_err(got), group_err(want), rtol=1e-5, atol=0)
    fmt = WeightFormat("w4a16", g, False)
    searched = ((reference.dequantize(pack.pack(w, fmt), 4 * g) - w) ** 2).view(48, 4, g).sum(dim=2)
    monkeypatch.setenv("IMPL_QUANT_INT4_SEARCH", "0")
    minmax = ((reference.dequantize(pack.pack(w, fmt), 4 * g) - w) ** 2).view(48, 4, g).sum(dim=2)
    assert bool((searched <= minmax * (1 + 1e-5)).all()) and float(searched.sum()) < 0.97 * float(minmax.sum())


def test_bad_layouts_are_refused(ext):
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.quant_linear(torch.randn(2, 48), pack.pack(torch.randn(8, 64), WeightFormat("w8a16")))
    bad = torch.zeros(8, 1, 50, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="B = g \\+ 4"):
        ext.quant_linear(x, bad)
    with pytest.raises(ValueError, match="cannot take"):
        pack.pack(torch.randn(8, 48), WeightFormat("w8a8"))


def test_w8a8_amx_tiles_give_the_row_kernels_bits(ext):
    """From 32 rows W8A8 runs on AMX-int8 tiles where the CPU has them (``quant_w8a8_prefill_isa``), from 5 rows with
    AVX-512 VNNI where it has that and no AMX (x's codes offset to unsigned bytes, the offset taken back exactly): the same
    exact int32 dot products and epilogue as the row kernel, so every row's bits match the row kernel's (each
    row alone), over full and partial 32-row blocks, a K of several 64-code blocks, several row superblocks and
    several chunks of packed weight blocks."""
    native = os.environ.get("IMPL_CPU_MARCH", "native") == "native"
    amx_build = "amx_int8" in kernel_cpu_flags() and ext.simd_isa() == "avx512" and native
    native_amx = amx_build and os.environ.get("IMPL_CPU_AMX") != "0"
    # without AMX, AVX-512 VNNI builds (Zen 4, Ice Lake servers; make test-avx512) run prefill with VPDPBUSD
    vnni = ext.simd_isa() == "avx512" and not amx_build and (not native or "avx512_vnni" in kernel_cpu_flags())
    assert ext.quant_w8a8_prefill_isa() == ("amx_int8" if native_amx else "avx512_vnni" if vnni else "simd")
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(128, 384, generator=g), torch.randn(77, 384, generator=g) * 3
    p = pack.pack(w, WeightFormat("w8a8"))
    full = ext.quant_linear(x, p)
    assert torch.equal(full, reference.linear(x, p))
    for i in (0, 31, 32, 63, 64, 76):
        assert torch.equal(ext.quant_linear(x[i : i + 1], p), full[i : i + 1])
    for n in (4, 5, 8, 9, 17):  # around the VNNI kernel's first row count; every last pass of 1-8 rows
        assert torch.equal(ext.quant_linear(x[3 : 3 + n], p), full[3 : 3 + n])
    # K = 6144 (E2B's down projection): the tiles pass over x in superblocks of 128 rows, so 200 rows take two;
    # then fewer rows through the same (kept) scratch
    w, x = torch.randn(64, 6144, generator=g), torch.randn(200, 6144, generator=g)
    p = pack.pack(w, WeightFormat("w8a8"))
    full = ext.quant_linear(x, p)
    assert torch.equal(full, reference.linear(x, p))
    assert torch.equal(ext.quant_linear(x[:45], p), full[:45])
    for i in (0, 127, 128, 199):
        assert torch.equal(ext.quant_linear(x[i : i + 1], p), full[i : i + 1])
    # more than 4096 weight rows: the weight blocks are packed in two chunks
    w, x = torch.randn(4160, 128, generator=g), torch.randn(40, 128, generator=g)
    p = pack.pack(w, WeightFormat("w8a8"))
    full = ext.quant_linear(x, p)
    assert torch.equal(full, reference.linear(x, p))
    assert torch.equal(ext.quant_linear(x[39:], p), full[39:])


@pytest.mark.parametrize("fmt", [WeightFormat("w8a8"), WeightFormat("w4a8", 128, False)])
def test_large_outputs_streamed_to_memory_keep_their_bits(ext, fmt):
    """From 8 MB of float32 output the tile kernels store it non-temporally (AMX; ``kAmxStreamOutBytes``), for the
    plain product and the gated MLP's GELU x up: every row has the bits it gets alone (an ordinary store, the row
    kernels), including the last rows of a partial 32-row block, and the tiled W8A8 weight the same."""
    g = torch.Generator().manual_seed(13)
    w, x = torch.randn(32768, 128, generator=g), torch.randn(130, 128, generator=g) * 3  # gated: 130 x 16384 x 4 B
    p = pack.pack(w, fmt)
    full, gated = ext.quant_linear(x, p), ext.quant_gelu_mul(x, p)
    assert full.shape == (130, 32768) and gated.shape == (130, 16384)
    torch.testing.assert_close(full, reference.linear(x, p), rtol=1e-5, atol=1e-4)
    for rows in (slice(0, 1), slice(31, 33), slice(129, 130)):
        assert torch.equal(ext.quant_linear(x[rows], p), full[rows])
        assert torch.equal(ext.quant_gelu_mul(x[rows], p), gated[rows])
    t = ext.quant_tile_order_(p.clone(), 128)  # W8A8 and W4A8 alike
    assert torch.equal(ext.quant_linear(x, t), full) and torch.equal(ext.quant_gelu_mul(x, t), gated)


def test_w8a8_tile_order_gives_the_same_bits(ext):
    """Where the CPU has AMX-int8 tiles a W8A8 weight is put in tile order in place (``quant_tile_order_``: the
    same bytes, rearranged per 32 output rows; prefill's tiles read it without repacking, decode's VNNI kernel
    64 bytes per instruction at one row, tiles again from 2 rows): the same codes and scales (dequantized), and
    every kernel on it the bits of the row layout, at decode's row counts (1; 2-16: three blocks, so a thread
    reads a pair of them as two streams and one alone; 17 and 31: a second x row group), from 32 rows (prefill's
    tiles), for the gated MLP product, and with a checkpoint's -128 codes. Elsewhere (or with N, K off the
    tiles' multiples) the weight comes back untouched."""
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(-128, 128, (96, 192), generator=g, dtype=torch.int16).to(torch.int8)
    codes[0] = -128
    w = pack.from_codes(codes, torch.rand(96, 1, generator=g) * 0.01, None, WeightFormat("w8a8"))
    t = ext.quant_tile_order_(w.clone(), 192)
    tiles = ext.quant_w8a8_prefill_isa() == "amx_int8"
    assert tuple(t.shape) == ((3, 1, 32 * 192 + 128) if tiles else tuple(w.shape))
    assert t.numel() == w.numel() and torch.equal(ext.quant_dequant(t, 192), ext.quant_dequant(w, 192))
    for rows in (1, 2, 5, 16, 17, 31, 40):
        x = torch.randn(rows, 192, generator=g) * 3
        assert torch.equal(ext.quant_linear(x, t), ext.quant_linear(x, w))
        assert torch.equal(ext.quant_gelu_mul(x, t), ext.quant_gelu_mul(x, w))
    odd = pack.pack(torch.randn(48, 192, generator=g), WeightFormat("w8a8"))  # N not a multiple of 32
    assert ext.quant_tile_order_(odd, 192) is odd


@pytest.mark.parametrize("group", [64, 128, 256])
def test_w4a8_tile_order_gives_the_same_bits(ext, group):
    """Where the CPU has AMX-int8 tiles or AVX-512 VNNI, and in the AVX2 build, a W4A8 weight is put in tile order in place
    (``quant_tile_order_``: per 32 output rows and group, each 64-byte line two rows of a B tile in its two nibbles,
    then the 32 scales and zero points): the same codes, scales and zero points (dequantized), and every kernel on it
    the bits of the row layout. AMX: the VNNI kernel at 1-8 rows (three blocks: up to 4 rows a pair read as two
    streams and one alone, 5-8 rows one block at a time), the tiles from 9 (one row block streamed; more unpacked
    first; a partial block of x). VNNI without AMX: the same VNNI kernel at 1-8 rows, from 9 x's rows in groups of 12
    passing over each block (every group size 1-12 as the last). AVX2: one row a pair of blocks as two streams and one alone, more rows block by
    block with x's rows 8 at a time (every pass shape of 1-8 rows, and a last partial one). Also the gated MLP product,
    zero points 0 and 15. Elsewhere (groups of 32, N off a multiple of 32, a zero point that is not an integer 0..15)
    the weight comes back untouched."""
    g = torch.Generator().manual_seed(17)
    fmt = WeightFormat("w4a8", group, symmetric=False)
    w = pack.pack(torch.randn(96, 512, generator=g), fmt)
    w.view(96, -1, group // 2 + 8)[0, 0, group // 2 + 4 : group // 2 + 8] = torch.tensor([0.0]).view(torch.int8)
    w.view(96, -1, group // 2 + 8)[1, 0, group // 2 + 4 : group // 2 + 8] = torch.tensor([15.0]).view(torch.int8)
    t = ext.quant_tile_order_(w.clone(), 512)
    tiles = ext.w4a8_tile_order_here()
    assert tiles == (ext.quant_w8a8_prefill_isa() in ("amx_int8", "avx512_vnni") or ext.simd_isa() == "avx2")
    assert tuple(t.shape) == ((3, 512 // group, 16 * group + 256) if tiles else tuple(w.shape))
    assert t.numel() == w.numel() and torch.equal(ext.quant_dequant(t, 512), ext.quant_dequant(w, 512))
    for rows in (*range(1, 25), 33, 40):
        x = torch.randn(rows, 512, generator=g) * 3
        assert torch.equal(ext.quant_linear(x, t), ext.quant_linear(x, w)), rows
        assert torch.equal(ext.quant_gelu_mul(x, t), ext.quant_gelu_mul(x, w)), rows
    untouched = [pack.pack(torch.randn(96, 512, generator=g), WeightFormat("w4a8", 32, symmetric=False)),
                 pack.pack(torch.randn(48, 512, generator=g), fmt)]
    half_z = w.clone()
    half_z.view(96, -1, group // 2 + 8)[5, 1, group // 2 + 4 : group // 2 + 8] = torch.tensor([7.5]).view(torch.int8)
    for u in untouched + [half_z]:
        assert ext.quant_tile_order_(u, 512) is u


@pytest.mark.parametrize("fmt", [WeightFormat("w8a16"), WeightFormat("w4a16", 32), WeightFormat("w4a16", 128, False),
                                 WeightFormat("w4a16", 256, False)], ids=["w8a16", "w4a16-g32-sym", "w4a16-g128-asym",
                                                                          "w4a16-g256-asym"])
def test_weight_only_prefill_in_bf16_dot_products(ext, fmt):
    """With ``bf16_dot`` (a bf16 model's linear plan) a W8A16 / W4A16 weight above the small-weight floor meets
    ``quant_bf16_dot_min_rows()`` rows or more in bf16 dot products where the CPU has AMX-bf16 tiles or AVX-512 BF16
    (``quant_w16_prefill_isa``; ``make test-amx-emulated`` runs the tiles on a CPU without them): the reference on x rounded to bf16 (the codes are exact in bf16, the sums float32),
    per chunk of 256 inputs inside a per-channel group of 512; a row's result does not depend on the rows beside it
    (fast prefill's cross-decoder, the deterministic mode). Under that many rows W4A16 (and W8A16 from 4 rows) takes
    bf16 dot products row by row (decode: the reference on bf16-rounded x, rows alone; W8A16 under 4 rows keeps its
    float32 row kernel's bits); N off a multiple of 32 and ``bf16_dot`` off keep the float32 paths' bits; elsewhere
    ``bf16_dot`` changes nothing."""
    g = torch.Generator().manual_seed(23)
    p = pack.pack(torch.randn(128, 512, generator=g), fmt)  # 65,536 elements: the floor
    odd = pack.pack(torch.randn(144, 512, generator=g), fmt)
    x = torch.randn(41, 512, generator=g) * 2
    flags, native = kernel_cpu_flags(), cpp_build.march() == "native"
    tiles = native and "amx_bf16" in flags and os.environ.get("IMPL_CPU_AMX") != "0"
    isa = ext.quant_w16_prefill_isa()
    assert isa == ("amx_bf16" if tiles else "avx512_bf16" if native and "avx512_bf16" in flags else "")
    runs = isa != ""
    low = ext.quant_bf16_dot_min_rows()
    assert low == (8 if runs else 0)
    got = ext.quant_linear(x, p, True)
    if runs:
        torch.testing.assert_close(got, reference.linear(x.bfloat16().float(), p), rtol=1e-5, atol=2e-4)
        for rows in (slice(0, low), slice(5, 5 + low + 1), slice(3, 29), slice(24, 41)):  # passes of 6 rows and a last of 2, 3 or 5
            assert torch.equal(ext.quant_linear(x[rows], p, True), got[rows])
        assert torch.equal(ext.quant_linear(x.bfloat16(), p, True), got)  # bf16 x as it is
    else:
        assert torch.equal(got, ext.quant_linear(x, p))
    assert torch.equal(ext.quant_linear(x, odd, True), ext.quant_linear(x, odd))
    few = x[: max(low - 1, 1)]
    if runs:  # under `low` rows: bf16 dot products row by row (decode), W8A16 from 4 rows (kW8DotMinRows)
        if fmt.kind == "w8a16":
            assert torch.equal(ext.quant_linear(few[:3], p, True), ext.quant_linear(few[:3], p))
        got = ext.quant_linear(few, p, True)
        torch.testing.assert_close(got, reference.linear(few.bfloat16().float(), p), rtol=1e-5, atol=2e-4)
        for rows in (slice(0, 1), slice(2, 5), slice(3, len(few))) if fmt.kind == "w4a16" else (slice(2, 6), slice(3, 7)):
            assert torch.equal(ext.quant_linear(few[rows], p, True), got[rows])
        tail = pack.pack(torch.randn(129, 512, generator=g), fmt)  # an odd N: the last weight row alone
        torch.testing.assert_close(ext.quant_linear(few, tail, True), reference.linear(few.bfloat16().float(), tail),
                                   rtol=1e-5, atol=2e-4)
    else:
        assert torch.equal(ext.quant_linear(few, p, True), ext.quant_linear(few, p))


@pytest.mark.parametrize("fmt", [WeightFormat("w8a16"), WeightFormat("w4a16", 128, False)], ids=["w8a16", "w4a16-g128-asym"])
def test_weight_only_bf16_dot_products_over_spans_and_row_blocks(ext, fmt):
    """K = 4096 and 300 rows: the AMX-bf16 kernel's two spans of 2048 inputs (the totals carried through out between
    them) and two x superblocks (256 rows of a span's 2048 inputs each), the AVX-512 BF16 kernel's many panels: the
    reference on bf16-rounded x, and rows alone (inside a superblock, across its edge, the last partial 32 rows)
    keep their bits."""
    if not ext.quant_w16_prefill_isa():
        pytest.skip("no bf16 dot products in this build (quant_w16_prefill_isa)")
    g = torch.Generator().manual_seed(29)
    p = pack.pack(torch.randn(64, 4096, generator=g), fmt)
    x = torch.randn(300, 4096, generator=g)
    got = ext.quant_linear(x, p, True)
    torch.testing.assert_close(got, reference.linear(x.bfloat16().float(), p), rtol=1e-5, atol=1e-3)
    for rows in (slice(0, 8), slice(250, 262), slice(280, 300)):
        assert torch.equal(ext.quant_linear(x[rows], p, True), got[rows])
