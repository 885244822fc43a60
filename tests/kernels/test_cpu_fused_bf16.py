"""bf16 weights through the compiled CPU paths (impl/kernels/cpu_fused): each route of ``linear`` and the two
layer kernels against their float32 references on the same bf16 values, with tolerances derived from
bf16 rounding; the transform on a bf16 model (record, released parameters, LM head)."""

from __future__ import annotations

import pytest
import torch

from impl.kernels import cpu_fused
from impl.kernels.cpu_fused import linear as cpu_linear
from impl.kernels.cpu_fused import reference as ref
from impl.kernels.cpu_fused import transform as cpu_fused_transform

EXT = cpu_fused.load()
needs_ext = pytest.mark.skipif(EXT is None, reason=f"fused CPU kernels not built here: {cpu_fused.error()}")
needs_native = pytest.mark.skipif(not cpu_linear.native_bf16(), reason="no native bf16 (oneDNN's bf16 matmul) here")
DOTS = EXT is not None and EXT.bf16_dot_rows_here()  # linear's bf16 dot products up to 16 rows (AVX-512 BF16 build)

U_BF16 = 2.0**-9  # unit roundoff of bfloat16 (8 significant bits)
U_F32 = 2.0**-24


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _bf16(*shape, g, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).bfloat16()


def _check_linear(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bf16_inputs: bool) -> None:
    """y = x @ w^T within the rounding bound of its route: K float32 additions (K u32 sum|x w|); the
    oneDNN bf16 route also rounds x (u_bf16 sum|x w|) and its output (u_bf16 |y|) to bf16."""
    xd, wd = x.double(), w.double()
    want = xd @ wd.t()
    mag = xd.abs() @ wd.abs().t()
    bound = x.shape[1] * U_F32 * mag
    if bf16_inputs:
        bound = bound + U_BF16 * mag + U_BF16 * want.abs()
    assert y.dtype == torch.float32 and y.shape == want.shape
    assert bool(((y.double() - want).abs() <= 1.01 * bound + 1e-30).all()), float(((y.double() - want).abs() / (bound + 1e-30)).max())


@needs_ext
@pytest.mark.parametrize("m,n,k", [(1, 7, 5), (3, 40, 70), (16, 300, 256), (17, 512, 256), (40, 1024, 96), (300, 48, 64)])
def test_linear_bf16_weight_float32_arithmetic(m, n, k):
    """The row kernel (<= 16 rows, or a weight under oneDNN's size floor at any row count) and the widened
    float32 blocks for ATen's mm (more rows): float32 arithmetic on the bf16 values."""
    g = _gen(m * 1000 + n)
    x, w = torch.randn(m, k, generator=g), _bf16(n, k, g=g)
    _check_linear(EXT.linear(x, w, False), x, w, bf16_inputs=False)
    _check_linear(EXT.bf16_rows(x, w), x, w, bf16_inputs=False)
    # bf16 activations are widened exactly
    _check_linear(EXT.linear(x.bfloat16(), w, False), x.bfloat16().float(), w, bf16_inputs=False)


@needs_ext
@needs_native
@pytest.mark.parametrize("m", [1, 16, 17, 300])
def test_linear_bf16_through_onednn(m):
    """oneDNN's bf16 matmul (plain weights above the row kernel's row count; prepacked at every count)."""
    g = _gen(m)
    n, k = 512, 256  # 128K elements: sized for oneDNN
    x, w = torch.randn(m, k, generator=g), _bf16(n, k, g=g)
    rounds_x = m > cpu_linear.BF16_ROW_KERNEL_MAX_ROWS or DOTS  # oneDNN, or the dot products, take x in bf16
    _check_linear(EXT.linear(x, w, True), x, w, bf16_inputs=rounds_x)
    _check_linear(EXT.linear(x, cpu_linear.pack(w), False), x, w, bf16_inputs=True)


@needs_ext
@pytest.mark.skipif(not DOTS, reason="no AVX-512 BF16 build here (bf16_dot_rows)")
def test_bf16_dot_rows_round_x_and_keep_each_row_alone():
    """The decode-size kernel in bf16 dot products: x rounded to bf16, then float32 sums within their rounding
    bound; a row's bits do not depend on the rows beside it (passes of 1-8 rows, 8 / 4 / 2 weight rows a pass,
    K and N off the vector width); linear takes it with onednn up to 16 rows for a weight sized for oneDNN."""
    g = _gen(11)
    for m, n, k in [(20, 300, 1000), (9, 64, 1536), (5, 17, 33), (1, 7, 31), (16, 259, 96)]:
        x, w = torch.randn(m, k, generator=g), _bf16(n, k, g=g)
        whole = EXT.bf16_dot_rows(x, w)
        _check_linear(whole, x.bfloat16().float(), w, bf16_inputs=False)
        for rows in (slice(0, 1), slice(m // 2, m), slice(m - 1, m), slice(0, min(m, 3))):
            assert torch.equal(EXT.bf16_dot_rows(x[rows], w), whole[rows]), (m, n, k, rows)
    x, w = torch.randn(16, 256, generator=g), _bf16(512, 256, g=g)
    assert torch.equal(EXT.linear(x, w, True), EXT.bf16_dot_rows(x, w))
    assert torch.equal(EXT.linear(x[:3], w, False), EXT.bf16_rows(x[:3], w))  # no native bf16 asked: float32 x
    with pytest.raises(RuntimeError, match="contiguous bfloat16"):
        EXT.bf16_dot_rows(x, w.float())


@needs_ext
@needs_native
@pytest.mark.skipif(not DOTS, reason="no AVX-512 BF16 build here (packed_dot_rows)")
def test_packed_dot_rows_read_onednn_layout_in_place():
    """bf16 weights prepacked for oneDNN, read as they lie by the bf16 dot products: the packed copy is compared with
    its source for the layout before any read; x rounded to bf16, then float32 sums within their rounding bound; a
    row's bits do not depend on the rows beside it (one row four or two blocks a pass, two rows two, passes of 6, K
    chunks of 1024 from 7 rows); linear takes it up to 16 rows with onednn, oneDNN above and without onednn; a copy
    that is not its source laid out as read, or a shape oneDNN pads, keeps oneDNN at every row count. The layout is
    oneDNN's on AVX-512 BF16 without AMX (Zen 4); elsewhere a shape whose layout differs keeps oneDNN."""
    g = _gen(23)
    matched = []
    for n, k in [(640, 256), (256, 2560), (192, 96)]:
        w = _bf16(n, k, g=g)
        p = cpu_linear.pack(w, dots=True)
        matched.append(EXT.packed_dot_block(p))
        if not matched[-1]:
            continue  # another CPU's oneDNN lays it out otherwise: oneDNN keeps it (checked below on Zen 4's layout)
        x = torch.randn(16, k, generator=g)
        whole = EXT.packed_dot_rows(x, p)
        _check_linear(whole, x.bfloat16().float(), w, bf16_inputs=False)
        for rows in (slice(0, 1), slice(0, 2), slice(3, 9), slice(5, 16), slice(15, 16)):
            assert torch.equal(EXT.packed_dot_rows(x[rows], p), whole[rows]), (n, k, rows)
        assert torch.equal(EXT.linear(x, p, True), whole)
        onednn = EXT.linear(x, p, False)  # no dot products asked: oneDNN's matmul (its own sums)
        _check_linear(onednn, x, w, bf16_inputs=True)
        big = torch.randn(17, k, generator=g)
        assert torch.equal(EXT.linear(big, p, True), EXT.linear(big, p, False))
    if cpu_linear.bf16_isa() == "avx512_bf16":  # AVX-512 BF16 without AMX (Zen 4): the layout the kernel was built for
        assert matched == [64, 64, 64]
    # the check can fail: a packed copy of another weight, and a padded shape, record no layout
    w, other = _bf16(320, 96, g=g), _bf16(320, 96, g=g)
    assert EXT.packed_dot_layout(w, cpu_linear.pack(other)) == 0 and EXT.packed_dot_block(cpu_linear.pack(w)) == 0
    x = torch.randn(2, 96, generator=g)
    assert torch.equal(EXT.linear(x, cpu_linear.pack(w, dots=True), True), EXT.linear(x, cpu_linear.pack(w), False))
    odd = cpu_linear.pack(_bf16(300, 64, g=g), dots=True)  # 300 outputs: no block width divides them
    assert EXT.packed_dot_block(odd) == 0
    if cpu_linear.bf16_isa() == "avx512_bf16":
        assert EXT.packed_dot_block(cpu_linear.pack(_bf16(64, 70, g=g), dots=True)) == 0  # oneDNN pads K = 70 to 96
    with pytest.raises(RuntimeError, match="whose layout packed_dot_layout recorded"):
        EXT.packed_dot_rows(x[:, :64], odd)


@needs_ext
def test_row_kernel_rows_do_not_depend_on_the_batch():
    """Each output row of the row kernel equals that row computed alone, bit for bit (small weights take
    it at any row count, so a tiny bf16 model's rows do not depend on which other rows share the call)."""
    g = _gen(7)
    # from 4 rows a weight under MIN_WEIGHT_ELEMS takes the column kernel, one row the row kernel: the same sums;
    # shapes with K and N off the vector width (a K tail, outputs past the last whole vector), K under it
    shapes = [(40, 256, 64), (16, 2048, 1536), (300, 200, 80), (64, 256, 16), (33, 13, 5), (20, 9, 250), (17, 40, 24)]
    for m, n, k in shapes:
        small = n * k < cpu_linear.MIN_WEIGHT_ELEMS  # a small float32 weight takes them too (a larger one ATen's mm)
        for w in (_bf16(n, k, g=g),) + ((torch.randn(n, k, generator=g),) if small else ()):
            x = torch.randn(m, k, generator=g)
            whole = EXT.linear(x, w, False)
            for i in (0, 5, m - 1):
                assert torch.equal(whole[i : i + 1], EXT.linear(x[i : i + 1], w, False)), (m, n, k, i, w.dtype)
    assert cpu_linear.BF16_ROW_KERNEL_MAX_ROWS == EXT.bf16_row_kernel_max_rows()


def _modes():
    out = ["mkl"]
    if cpu_linear.native_bf16():
        out += ["onednn", "packed"] + (["packed-dots"] if DOTS else [])
    return out


def _onednn(mode: str) -> bool:
    """The layer kernels' `onednn` argument: plain weights through oneDNN, or packed ones' decode-size rows in the
    bf16 dot products on their layout."""
    return mode in ("onednn", "packed-dots")


def _layer_tol(mode: str, rows: int) -> float:
    """Relative to the output's scale: the float32-arithmetic routes round once, into the bf16 output
    (u_bf16); oneDNN's bf16 matmuls also round each matmul input and output on the way (about eight
    roundings on an element's path through the layer), doubled for margin."""
    onednn_rows = mode.startswith("packed") or (mode == "onednn" and (rows > cpu_linear.BF16_ROW_KERNEL_MAX_ROWS or DOTS))
    return (16 if onednn_rows else 2) * U_BF16


def _w(t: torch.Tensor, mode: str) -> torch.Tensor:
    return cpu_linear.pack(t, dots=mode == "packed-dots") if mode.startswith("packed") else t


@needs_ext
@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("n", [1, 5, 40])
def test_attn_pre_bf16_matches_float32_reference(mode, n):
    g = _gen(n + 17)
    q_heads, kv_heads, d, hid = 8, 1, 64, 256  # proj [640, 256]: sized for oneDNN
    heads = q_heads + 2 * kv_heads
    h, proj = _bf16(n, hid, g=g), _bf16(heads * d, hid, g=g, scale=0.1)
    w_in, head_w = torch.randn(hid, generator=g), torch.randn(heads, d, generator=g)
    cos, sin = _bf16(n, d, g=g), _bf16(n, d, g=g)
    got = EXT.attn_pre(h, w_in, _w(proj, mode), head_w, cos, sin, q_heads, 1e-6, _onednn(mode))
    want = ref.attn_pre(h, w_in, proj, head_w, cos, sin, q_heads, 1e-6)
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16  # q / k / v leave in h's dtype (the KV pool's)
        scale = float(b.abs().max())
        assert float((a.float() - b).abs().max()) <= _layer_tol(mode, n) * scale, (float((a.float() - b).abs().max()), scale)


@needs_ext
@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("n,ple_dim", [(1, 16), (6, 0), (40, 16)])
def test_decoder_post_bf16_matches_float32_reference(mode, n, ple_dim):
    g = _gen(300 + n)
    hid, hd, inter = 256, 512, 512  # every weight >= 128K elements: sized for oneDNN
    h, attn = _bf16(n, hid, g=g), _bf16(n, hd, g=g)
    o_w, gate, up, down = (_bf16(*s, g=g, scale=0.05) for s in ((hid, hd), (inter, hid), (inter, hid), (hid, inter)))
    norms = [torch.randn(hid, generator=g) for _ in range(3)]
    if ple_dim:
        ple = _bf16(n, 3, ple_dim, g=g)[:, 1]  # a [T, L, P] table's layer slice, as the model passes it
        pg, pp, pn = _bf16(ple_dim, hid, g=g, scale=0.1), _bf16(hid, ple_dim, g=g, scale=0.1), torch.randn(hid, generator=g)
    else:
        ple = pg = pp = pn = None
    gate_up = [_w(gate, mode), _w(up, mode)] if mode != "mkl" else [torch.cat([gate, up])]
    got = EXT.decoder_post(h, attn, _w(o_w, mode), norms[0], norms[1], gate_up, _w(down, mode), norms[2], ple,
                           None if pg is None else _w(pg, mode), None if pp is None else _w(pp, mode), pn, 0.7, 1e-6,
                           _onednn(mode))
    want = ref.decoder_post(h, attn, o_w, norms[0], norms[1], [gate, up], down, norms[2], ple, pg, pp, pn, 0.7, 1e-6)
    assert got.dtype == torch.bfloat16
    scale = float(want.abs().max())
    assert float((got.float() - want).abs().max()) <= _layer_tol(mode, n) * scale, (float((got.float() - want).abs().max()), scale)


@needs_ext
@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("n", [1, 5, 300])
def test_bf16_rows_are_read_and_written_in_place(mode, n):
    """The kernels read bf16 activations (h, the attention output, a strided slice of the per-layer inputs)
    row by row and round their bf16 results once: the same bits as the float32 rows of the same values, with
    the float32 results rounded to bf16 (so no whole-tensor conversion is needed on either side)."""
    g = _gen(900 + n)
    hid, hd, inter, p, d = 256, 512, 512, 16, 64
    h, attn, ple = _bf16(n, hid, g=g), _bf16(n, hd, g=g), _bf16(n, 3, p, g=g)[:, 1]
    o_w, gate, up, down = (_bf16(*s, g=g, scale=0.05) for s in ((hid, hd), (inter, hid), (inter, hid), (hid, inter)))
    pg, pp = _bf16(p, hid, g=g, scale=0.1), _bf16(hid, p, g=g, scale=0.1)
    norms = [torch.rand(hid, generator=g) + 0.5 for _ in range(4)]
    gate_up = [_w(gate, mode), _w(up, mode)] if mode != "mkl" else [torch.cat([gate, up])]
    weights = (_w(o_w, mode), gate_up, _w(down, mode), _w(pg, mode), _w(pp, mode))

    def post(hh, aa, pl):
        o, gu, dn, wg, wp = weights
        return EXT.decoder_post(hh, aa, o, norms[0], norms[1], gu, dn, norms[2], pl, wg, wp, norms[3], 0.7, 1e-6,
                                _onednn(mode))

    got = post(h, attn, ple)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, post(h.float(), attn.float(), ple.float()).bfloat16())
    proj, head_w = _bf16(10 * d, hid, g=g, scale=0.1), torch.rand(10, d, generator=g) + 0.5
    cos, sin = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    q, k, v = EXT.attn_pre(h, norms[0], _w(proj, mode), head_w, cos, sin, 8, 1e-6, _onednn(mode))
    q32, k32, v32 = EXT.attn_pre(h.float(), norms[0], _w(proj, mode), head_w, cos, sin, 8, 1e-6, _onednn(mode))
    for a, b in ((q, q32), (k, k32), (v, v32)):
        assert a.dtype == torch.bfloat16 and b.dtype == torch.float32
        assert torch.equal(a, b.bfloat16())


@needs_ext
@pytest.mark.parametrize("linear", ["auto", "packed"])
def test_transform_serves_a_bf16_model(linear, monkeypatch):
    """A bf16 model on the fused kernels: the record says so; the LM head and the per-layer-input projection
    run the extension's linear; with prepacked weights the plain parameters are released (meta tensors),
    not held beside the copies."""
    from tests.helpers.session import Session

    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    if linear == "packed":
        if not cpu_linear.onednn_bf16_available():
            monkeypatch.setenv(cpu_linear.ENV, "packed")  # refused with the fix, not a traceback from the pack
            with pytest.raises(ValueError, match="IMPL_CPU_LINEAR=packed sends bf16 weights to oneDNN, which has no bf16 path"):
                cpu_linear.plan(torch.bfloat16)
            pytest.skip("oneDNN has no bf16 path here")
        monkeypatch.setenv(cpu_linear.ENV, "packed")
        monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_ELEMS", 0)
    model = load_model(tiny_checkpoint("e2b"), dtype="bfloat16")
    before = cpu_fused_transform.storage_bytes(model)
    layer_bytes = sum(p.numel() * p.element_size() for m in model.layers for n, p in m.named_parameters()
                      if n.endswith(("proj.weight", "input_gate.weight", "per_layer_projection.weight")))
    rec = cpu_fused_transform.apply(model)
    assert rec.layer_paths == ("fused",) * len(model.layers) and rec.weight_dtype == "bfloat16"
    assert {"per_layer_model_projection", "project_to_vocab"} <= set(rec.other_linears)
    assert "bfloat16 weights" in rec.describe() and rec.linear.dtype == "bfloat16"
    # what the transform holds beyond the loaded weights: float32 norm copies, V rows repeated for k_eq_v
    # layers' stacked q/k/v, oneDNN's padding; never a second copy of the layers' weights
    assert 0 < rec.extra_bytes < 0.25 * layer_bytes
    if linear == "packed":
        assert rec.linear.mode == "packed" and rec.packed_bytes >= layer_bytes
        assert all(p.is_meta for m in model.layers for n, p in m.named_parameters() if n.endswith("proj.weight"))
        assert cpu_fused_transform.storage_bytes(model) == before - layer_bytes  # embeddings, norms: kept
    else:
        assert rec.packed_bytes == 0
    out = Session(model).step([("a", [2, 5, 9, 11, 3, 7] + list(range(40, 60))), ("b", [2, 8, 8, 9])], all_logits=True)
    assert out.logits.dtype == torch.float32 and bool(out.logits.isfinite().all())
    h = torch.randn(3, model.config.hidden_size, generator=_gen(1)).bfloat16()
    w = model.lm_head_weight()
    _check_linear(model.project_to_vocab(h), h.float(), w, bf16_inputs=False)


@needs_ext
@pytest.mark.parametrize("n", [1, 7, 64])
def test_per_layer_inputs_in_one_pass_match_the_eager_ops(n):
    """A bf16 model's per-layer inputs through the transform's one-pass kernel (``PleInputsKernel``, installed as
    the model's ``ple_fused``) against ple.py's eager bf16 ops on the same model and tokens: the same bits
    except where the RMSNorm's float32 sum of squares lands on the other side of a bf16 rounding (at most one
    bf16 step; a handful of elements), and the missing-scale mutant's constant is read per call."""
    from impl.model import ple as ple_mod
    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    model = load_model(tiny_checkpoint("e2b"), dtype="bfloat16")
    cpu_fused_transform.apply(model)
    assert isinstance(model.ple_fused, cpu_fused_transform.PleInputsKernel)
    g = _gen(40 + n)
    ids = torch.randint(0, model.config.vocab_size_per_layer_input, (n,), generator=g)
    embeds = _bf16(n, model.config.hidden_size, g=g, scale=4.0)
    got = model.per_layer_inputs(ids, embeds)
    fused, model.ple_fused = model.ple_fused, None
    want = model.per_layer_inputs(ids, embeds)
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    differ = got != want
    assert int(differ.sum()) <= max(2, want.numel() // 1000)
    step = want.float().abs().clamp_min(2.0**-126) * 2.0**-7  # one bf16 step at the value's scale
    assert bool(((got.float() - want.float()).abs() <= step).all())
    model.ple_fused = fused
    old = ple_mod.PER_LAYER_INPUT_SCALE
    try:
        ple_mod.PER_LAYER_INPUT_SCALE = 1.0
        assert not torch.equal(model.per_layer_inputs(ids, embeds), got)
    finally:
        ple_mod.PER_LAYER_INPUT_SCALE = old


@needs_ext
def test_quantized_per_layer_inputs_in_row_blocks_equal_one_pass():
    """A quantized per-layer-input projection's float32 product is taken in blocks of ``ROWS`` rows (a fresh 37 MB
    mapping per prefill page-faulted on every write): its rows are independent, so the blocks give one pass's
    bits, at any block size."""
    from impl.quant import pack
    from impl.quant.base import WeightFormat

    ext = cpu_fused.load()
    g = _gen(77)
    layers, p, hidden, n = 8, 16, 64, 700
    w = pack.pack(torch.randn(layers * p, hidden, generator=g) * 0.1, WeightFormat("w8a8"))
    kernel = cpu_fused_transform.PleInputsKernel(ext, cpu_fused_transform.LinearForward(ext, w, False))
    assert kernel.chunked and n > kernel.ROWS
    embeds, tok = _bf16(n, hidden, g=g, scale=4.0), _bf16(n, layers * p, g=g)
    norm_w = torch.rand(p, generator=g) + 0.5
    got = kernel(embeds, tok, norm_w, 1e-6, p, 0.7, 0.5)
    for rows in (10**9, 96):
        kernel.ROWS = rows
        assert torch.equal(kernel(embeds, tok, norm_w, 1e-6, p, 0.7, 0.5), got)
    assert got.shape == (n, layers * p) and got.dtype == torch.bfloat16
