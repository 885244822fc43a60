"""Fused CPU kernels (impl/kernels/cpu_fused) against their torch references, and the model with and without them."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from impl.kernels import cpu_fused
from impl.kernels.cpu_fused import linear as cpu_linear
from impl.kernels.cpu_fused import reference as ref
from impl.kernels.cpu_fused import transform as cpu_fused_transform

EXT = cpu_fused.load()
needs_ext = pytest.mark.skipif(EXT is None, reason=f"fused CPU kernels not built here: {cpu_fused.error()}")


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 2e-6) -> None:
    # float32 rounding only: RMSNorm's sum of squares and the softmax sum run in another order
    assert a.shape == b.shape
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    assert float((a - b).abs().max()) <= tol * scale if a.numel() else True


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@needs_ext
@pytest.mark.parametrize("n,q_heads,kv_heads,d", [(1, 4, 1, 16), (33, 4, 1, 32), (5, 8, 2, 16), (7, 4, 0, 32)])
def test_attn_pre_matches_reference(n, q_heads, kv_heads, d):
    g = _gen(n)
    heads, hidden = q_heads + 2 * kv_heads, 64
    h, w_in = torch.randn(n, hidden, generator=g), torch.randn(hidden, generator=g)
    proj, head_w = torch.randn(heads * d, hidden, generator=g) * 0.2, torch.randn(heads, d, generator=g)
    cos, sin = torch.randn(n, 1, d, generator=g), torch.randn(n, 1, d, generator=g)
    got = EXT.attn_pre(h, w_in, proj, head_w, cos, sin, q_heads, 1e-6)
    want = ref.attn_pre(h, w_in, proj, head_w, cos, sin, q_heads, 1e-6)
    for a, b in zip(got, want):
        _close(a, b)


@needs_ext
@pytest.mark.parametrize("n,inter,ple_dim", [(1, 128, 8), (40, 256, 8), (6, 128, 0)])
def test_decoder_post_matches_reference(n, inter, ple_dim):
    g = _gen(100 + n)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    hid, hd = 64, 64
    args = [r(n, hid), r(n, hd), r(hid, hd), r(hid), r(hid), [r(2 * inter, hid)], r(hid, inter), r(hid)]
    # the per-layer input is a [T, L, P] table's layer slice (rows L * P apart), as the model passes it
    ple = [r(n, 5, ple_dim)[:, 2], r(ple_dim, hid), r(hid, ple_dim), r(hid)] if ple_dim else [None] * 4
    got = EXT.decoder_post(*args, *ple, 0.625, 1e-6)
    want = ref.decoder_post(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], *ple, 0.625, 1e-6)
    _close(got, want)


A_PROMPT = [2, 5, 9, 11, 3, 7] + list(range(40, 60))  # longer than the e2b window (16)
B_PROMPT = [2, 8, 8, 9]


def _run_session(model) -> dict[str, torch.Tensor]:
    """Two requests through prefill (every row's logits), a decode step and a mixed step; logits per
    request in position order."""
    from tests.helpers.session import Session

    s = Session(model)
    a = s.step([("a", A_PROMPT), ("b", B_PROMPT)], all_logits=True).logits
    b = s.step([("a", [7]), ("b", [9])]).logits  # one row per request: the decode path
    c = s.step([("a", [3, 4, 5]), ("b", [10])], all_logits=True).logits  # extend + decode rows
    na = len(A_PROMPT)
    return {"a": torch.cat([a[:na], b[:1], c[:3]]), "b": torch.cat([a[na:], b[1:], c[3:]])}


SEQS = {"a": A_PROMPT + [7, 3, 4, 5], "b": B_PROMPT + [9, 10]}


def _assert_meets_parity_bar(got: dict[str, torch.Tensor], hf32, hf64) -> None:
    """Each request's logits within max(10x transformers' own float32 error, 1e-4) of transformers in float64."""
    for k, seq in SEQS.items():
        with torch.no_grad():
            truth = hf64(torch.tensor([seq])).logits[0]
            own = float((hf32(torch.tensor([seq])).logits[0].double() - truth).abs().max())
        err = float((got[k].double() - truth).abs().max())
        assert err <= max(10 * own, 1e-4), (k, err, own)


@needs_ext
@pytest.mark.parametrize("linear", ["auto", "packed", "onednn"])
@pytest.mark.parametrize("name", ["e2b", "k_eq_v", "noshare"])
def test_model_with_fused_kernels_meets_the_parity_bar(name, linear, monkeypatch):
    """The whole model on the torch_native backend with the fused kernels (layers and sliding-window
    attention), against transformers in float64, by the bar of the model parity tests: within
    max(10x transformers' own float32 error, 1e-4). These tiny random models amplify float32
    rounding (transformers' float32 run is off by up to ~3e-3 at 30 positions), so bit equality
    with the torch path is not expected. ``packed`` / ``onednn``: the linear layers through oneDNN
    (forced on these tiny weights, which ``auto`` leaves to ATen's mm)."""
    from tests.helpers.model import hf_pair

    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    if linear != "auto":
        if not cpu_linear.onednn_available():
            pytest.skip("torch built without oneDNN")
        monkeypatch.setenv(cpu_linear.ENV, linear)
        monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_ELEMS", 0)
    hf32, hf64 = hf_pair(name)
    model = load_model(tiny_checkpoint(name), dtype="float32")
    rec = cpu_fused_transform.apply(model)
    assert rec.fused_layers == len(model.layers) and rec.layer_paths == ("fused",) * len(model.layers)
    assert rec.linear.mode == ("mkl" if linear == "auto" else linear)
    # prepacked copies replace their parameters (the engine counts the difference as weights)
    assert (rec.packed_bytes > 0) == (linear == "packed") and rec.extra_bytes < 0.25 * rec.packed_bytes + 1e6
    assert model.layers[0].mlp.down_proj.weight.is_meta == (linear == "packed")
    _assert_meets_parity_bar(_run_session(model), hf32, hf64)


@needs_ext
def test_small_per_layer_input_weights_keep_mm_inside_a_packed_layer(monkeypatch):
    """The per-layer-input gate and projection (hidden x P) are often under oneDNN's size floor while the rest of
    the layer is far above it (e2b_bench: 16 x 256 beside 1024 x 256): the layer still runs on prepacked weights
    and only those two keep ATen's mm (they used to take the whole model off oneDNN). Same parity bar as above."""
    from tests.helpers.model import hf_pair

    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    if not cpu_linear.onednn_available():
        pytest.skip("torch built without oneDNN")
    hf32, hf64 = hf_pair("e2b")
    model = load_model(tiny_checkpoint("e2b"), dtype="float32")
    mains = [w for lay in model.layers for w in (lay.self_attn.o_proj.weight, lay.mlp.down_proj.weight)]
    ple = [lay.per_layer_input_gate.weight for lay in model.layers]
    floor = min(w.numel() for w in mains)
    assert max(w.numel() for w in ple) < floor  # the tiny model has the proportions of the case
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_ELEMS", floor)
    rec = cpu_fused_transform.apply(model)
    assert rec.linear.mode == "packed" and set(rec.routes()) == {"fused, packed"}, rec.routes()
    fwd = model.layers[0].forward
    assert fwd.f.down.is_mkldnn and not fwd.f.ple_gate.is_mkldnn and not fwd.f.ple_proj.is_mkldnn
    _assert_meets_parity_bar(_run_session(model), hf32, hf64)


def test_switch_off_and_failed_build_fall_back_to_torch(monkeypatch, caplog):
    monkeypatch.setenv(cpu_fused.ENV_SWITCH, "0")
    assert cpu_fused.load() is None
    monkeypatch.delenv(cpu_fused.ENV_SWITCH)

    def broken():
        raise RuntimeError("Error building extension 'impl_cpu_fused': g++ not found")

    monkeypatch.setattr(cpu_fused.EXTENSION, "_tried", False)
    monkeypatch.setattr(cpu_fused.EXTENSION, "_module", None)
    monkeypatch.setattr(cpu_fused.EXTENSION, "build", broken)
    with caplog.at_level(logging.WARNING, logger="impl.kernels"):
        assert cpu_fused.load() is None
        assert cpu_fused.load() is None  # tried once, warned once
    warnings = [r.getMessage() for r in caplog.records if "fused CPU kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "g++ not found" in warnings[0]
    assert "g++ not found" in cpu_fused.error()


def test_stale_build_lock_is_removed_fresh_one_kept(tmp_path):
    import time

    from impl.kernels import cpp_build

    lock = tmp_path / "lock"
    lock.write_text("")
    cpp_build.clear_stale_lock(str(lock))
    assert lock.exists()  # a build may be running right now
    old = time.time() - 2 * cpp_build.STALE_LOCK_S
    os.utime(lock, (old, old))
    cpp_build.clear_stale_lock(str(lock))
    assert not lock.exists()


@needs_ext
@pytest.mark.parametrize("d", [96, 6144 + 5])  # full vectors; a tail shorter than one
def test_mlp_activation_pass_matches_torch(d):
    """The MLP's GELU-tanh x up pass (activation.h): float32 within a few ulps of the exact value (torch's own
    gelu is within one; its 1 + tanh loses the tail below x ~ -4, ours keeps it); bf16 rows equal torch's bf16 ops
    except where the value is under 1e-5 of the input; NaN, infinities and the far tails as torch gives them."""
    ext = EXT
    g = _gen(3)
    x, u = torch.randn(16, d, generator=g) * 3, torch.randn(16, d, generator=g)
    exact = torch.nn.functional.gelu(x.double(), approximate="tanh") * u.double()
    y = ext.gelu_mul(x, u).double()
    assert ((y - exact).abs() / ((x * u).abs().double() + 1e-30)).max() < 4 * 2**-23
    xb, ub = x.bfloat16(), u.bfloat16()
    yb, rb = ext.gelu_mul(xb, ub), torch.nn.functional.gelu(xb, approximate="tanh") * ub
    differ = yb != rb
    assert differ[xb > -4].float().mean() < 0.01  # one-ulp ties (below -4 torch's 1 + tanh has lost the value)
    assert ((yb.float() - rb.float()).abs()[differ] <= 1e-5 * xb.float().abs()[differ] * ub.float().abs()[differ]).all()
    sp = torch.tensor([[-100.0, -9.0, 0.0, -0.0, 3.0, 100.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30]])
    got, want = ext.gelu_mul(sp, torch.ones_like(sp)), torch.nn.functional.gelu(sp, approximate="tanh")
    assert torch.equal(got.isnan(), want.isnan())
    close = ~want.isnan()
    assert torch.allclose(got[close], want[close], rtol=1e-6, atol=1e-20)  # (gelu(-9) ~ -1e-28; torch: -0)


@needs_ext
def test_bf16_rows_keep_denormals_and_round_nans_as_c10():
    """bf16 rows are rounded as c10::BFloat16 rounds (nearest even, every NaN -> 0x7FC0), also where the AVX512-BF16
    conversion instruction would not: it flushes denormal values to zero and keeps a NaN's sign and payload.
    gelu_tanh(16) is 16 exactly, so 16 x a denormal bf16 is exact: the output must hold it, in a vector of ordinary
    values too."""
    ext = EXT
    tiny = torch.tensor([k * 2.0**-133 for k in range(1, 8)]).bfloat16()  # bf16 denormals; 16 x each stays one
    u = torch.cat([tiny, torch.ones(25)]).bfloat16()  # 32 values: two AVX-512 vectors, the first mixed
    g = torch.full((32,), 16.0).bfloat16()
    got = ext.gelu_mul(g[None], u[None])[0]
    want = (16 * u.float()).bfloat16()  # exact products
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and (got[:7] != 0).all()
    nan = torch.tensor([-1.0]).div(0).mul(0).expand(32).bfloat16()  # a NaN with its sign bit set
    out = ext.gelu_mul(nan.contiguous()[None], torch.ones(1, 32).bfloat16())[0]
    assert (out.view(torch.int16) == 0x7FC0).all()


def test_kernels_accept_strided_activations():
    g = _gen(3)
    n, d, hid = 6, 16, 64
    h = torch.randn(hid, n, generator=g).t()  # a transposed view: not contiguous
    w_in, proj, head_w = torch.randn(hid, generator=g), torch.randn(6 * d, hid, generator=g) * 0.2, torch.randn(6, d, generator=g)
    cos, sin = torch.randn(n, 2 * d, generator=g)[:, ::2], torch.randn(n, d, generator=g)
    got = EXT.attn_pre(h, w_in, proj, head_w, cos, sin, 4, 1e-6)
    for a, b in zip(got, ref.attn_pre(h.contiguous(), w_in, proj, head_w, cos.contiguous(), sin, 4, 1e-6)):
        _close(a, b)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    args = [h, r(n, 64), r(hid, 64), r(hid), r(hid), [r(256, hid)], r(hid, 128), r(hid)]
    ple = [r(n, 8, 2)[:, :, 0], r(8, hid), r(hid, 8), r(hid)]  # P elements 2 apart: not row-contiguous
    got = EXT.decoder_post(*args, *ple, 1.0, 1e-6)
    _close(got, ref.decoder_post(*[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args], *ple, 1.0, 1e-6))


@needs_ext
@pytest.mark.parametrize("onednn", [False, True])
def test_small_float32_weights_give_a_row_the_same_bits_in_any_batch(onednn):
    """A float32 weight under the planner's oneDNN size (the tiny checkpoints' 8-wide per-layer projections) runs
    the row kernel at every row count: a row alone, among 16 and among 40 gets the same bits (fast prefill runs the
    cross-decoder on fewer rows; with ATen's mm one bit moved, and a W8A8 or fp8 quantizer downstream turned it
    into another code: QUANT-PARITY's 1.5e-2 logprob gap on an AVX2 EPYC)."""
    g = _gen(12)
    for n, k in [(64, 8), (8, 64), (200, 80)]:
        x, w = torch.randn(40, k, generator=g), torch.randn(n, k, generator=g)
        whole = EXT.linear(x, w, onednn)
        torch.testing.assert_close(whole, x @ w.t(), rtol=1e-5, atol=1e-5)
        for rows in (slice(0, 1), slice(5, 21), slice(39, 40)):
            assert torch.equal(EXT.linear(x[rows], w, onednn), whole[rows]), (n, k, rows)


@needs_ext
def test_row_loops_split_across_threads_give_the_same_rows():
    """With several torch threads the row loops run on ATen's pool: same values as with one."""
    g = _gen(11)
    n, hid = 300, 64  # several row chunks
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    pre = (r(n, hid), r(hid), r(6 * 16, hid), r(6, 16), r(n, 16), r(n, 16), 4, 1e-6)
    post = (r(n, hid), r(n, 64), r(hid, 64), r(hid), r(hid), [r(256, hid)], r(hid, 128), r(hid), r(n, 8), r(8, hid), r(hid, 8), r(hid), 0.5, 1e-6)
    before = torch.get_num_threads()
    try:
        one = (EXT.attn_pre(*pre), EXT.decoder_post(*post))
        torch.set_num_threads(2)
        two = (EXT.attn_pre(*pre), EXT.decoder_post(*post))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one[0], two[0]):
        _close(b, a)  # matmuls may block differently with two threads
    _close(two[1], one[1])


def test_float_fast_path_is_bit_identical_to_the_model_file(monkeypatch):
    """Without the extension the transform installs FloatLayerForward, which must give the reference
    forward's logits bit for bit (only the per-op dispatch differs)."""
    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    monkeypatch.setattr(cpu_fused, "load", lambda: None)
    fast = load_model(tiny_checkpoint("e2b"), dtype="float32")
    rec = cpu_fused_transform.apply(fast)
    plain = load_model(tiny_checkpoint("e2b"), dtype="float32")  # the model files' own forwards
    kinds = {type(layer.__dict__.get("forward")).__name__ for layer in fast.layers}
    assert kinds == {"FloatLayerForward"} and all("forward" not in layer.__dict__ for layer in plain.layers)
    assert rec.layer_paths == ("float",) * len(fast.layers) and rec.linear is None
    got, want = _run_session(fast), _run_session(plain)
    for k in SEQS:
        assert torch.equal(got[k], want[k]), k


needs_onednn = pytest.mark.skipif(not cpu_linear.onednn_available(), reason="torch built without oneDNN")


@needs_ext
@needs_onednn
@pytest.mark.parametrize("mode", ["packed", "onednn"])
@pytest.mark.parametrize("n,ple_dim", [(1, 8), (300, 0)])  # one decode row; several 256-row MLP blocks
def test_kernels_through_onednn_match_reference(mode, n, ple_dim):
    """The linear layers through oneDNN (prepacked or plain weights; GELU-tanh and the gating multiply in the
    activation pass over the MLP matmuls' outputs): the reference's values to float32 rounding."""
    g = _gen(500 + n)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    hid, q_heads, d, inter = 64, 4, 16, 128
    w = lambda t: cpu_linear.pack(t) if mode == "packed" else t  # noqa: E731
    onednn = mode == "onednn"
    h, w_in, proj, head_w = r(n, hid), r(hid), r(6 * d, hid), r(6, d)
    cos, sin = r(n, d), r(n, d)
    got = EXT.attn_pre(h, w_in, w(proj), head_w, cos, sin, q_heads, 1e-6, onednn)
    for a, b in zip(got, ref.attn_pre(h, w_in, proj, head_w, cos, sin, q_heads, 1e-6)):
        _close(a, b, 1e-5)
    args = [r(n, hid), r(n, 64), r(hid, 64), r(hid), r(hid), r(2 * inter, hid), r(hid, inter), r(hid)]
    ple = [r(n, ple_dim), r(ple_dim, hid), r(hid, ple_dim), r(hid)] if ple_dim else [None] * 4
    gate_up = [w(args[5][:inter]), w(args[5][inter:])]
    got = EXT.decoder_post(*args[:2], w(args[2]), *args[3:5], gate_up, w(args[6]), args[7], *ple, 0.625, 1e-6, onednn)
    want = ref.decoder_post(*[a.clone() for a in args[:5]], [args[5]], *args[6:], *ple, 0.625, 1e-6)
    _close(got, want, 1e-5)


@needs_ext
@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepacked_mlp_in_row_blocks_matches_reference(dtype):
    """A prepacked MLP wide enough for 256-row gate / up blocks (I = 2048) over 1300 rows: five blocks and a
    20-row one, their activations gathered for the down projection in calls of 1024 and 276 rows
    (fused_layer.cpp: kMlpDownRows). The reference's values to the rounding of the route."""
    if dtype == torch.bfloat16 and not cpu_linear.native_bf16():
        pytest.skip("no native bf16 (oneDNN's bf16 matmul) here")
    n, hid, inter = 1300, 64, 2048
    g = _gen(77)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    h, attn, o_w = r(n, hid), r(n, 64), r(hid, 64)
    norms = [r(hid) for _ in range(3)]
    gate_up, down = r(2 * inter, hid) * 0.1, r(hid, inter) * 0.1
    if dtype == torch.bfloat16:  # the same bf16 values on both sides
        h, attn, o_w, gate_up, down = (t.bfloat16() for t in (h, attn, o_w, gate_up, down))
    p = cpu_linear.pack
    got = EXT.decoder_post(h, attn, p(o_w), norms[0], norms[1], [p(gate_up[:inter]), p(gate_up[inter:])], p(down),
                           norms[2], None, None, None, None, 0.625, 1e-6, False)
    f = lambda t: t.float()  # noqa: E731
    want = ref.decoder_post(f(h), f(attn), f(o_w), norms[0], norms[1], [f(gate_up)], f(down), norms[2], None, None,
                            None, None, 0.625, 1e-6)
    assert got.dtype == dtype and got.shape == (n, hid)
    # bf16: oneDNN rounds each matmul's inputs and outputs to bf16 (about eight roundings on an element's path)
    _close(got.float(), want, 1e-5 if dtype == torch.float32 else 16 * 2.0**-9)



@needs_ext
def test_a_per_layer_input_wider_than_its_gate_is_refused():
    """decoder_post multiplies the PLE gate's [n, P] outputs by the per-layer input row by row: an input of another
    width is a clear error naming both widths (it was read and written past the gate's rows)."""
    g = _gen(7)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    hid, inter = 64, 128
    args = [r(2, hid), r(2, hid), r(hid, hid), r(hid), r(hid), [r(2 * inter, hid)], r(hid, inter), r(hid)]
    with pytest.raises(RuntimeError, match="gate's 8 outputs, got P = 64"):
        EXT.decoder_post(*args, r(2, 64), r(8, hid), r(hid, 8), r(hid), 1.0, 1e-6)


@needs_ext
def test_prepacked_gate_up_must_come_split():
    w = torch.randn(256, 64)
    packed = cpu_linear.pack(w) if cpu_linear.onednn_available() else None
    if packed is None:
        pytest.skip("torch built without oneDNN")
    args = [torch.randn(2, 64), torch.randn(2, 64), torch.randn(64, 64), torch.ones(64), torch.ones(64), [packed],
            torch.randn(64, 128), torch.ones(64), None, None, None, None, 1.0, 1e-6]
    with pytest.raises(RuntimeError, match="prepacked gate/up weight must come split"):
        EXT.decoder_post(*args)


def test_linear_plan_modes(monkeypatch):
    monkeypatch.delenv(cpu_linear.ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    if cpu_linear.onednn_available():
        assert cpu_linear.plan(torch.float32).mode == "packed"
        bf16 = cpu_linear.plan(torch.bfloat16)
        isa = cpu_linear.bf16_isa()
        if isa:
            # native bf16: oneDNN's prepacked matmul, decode-size rows in the dot products on its layout where built
            dots = cpu_linear.bf16_dots_here()
            assert bf16 == cpu_linear.LinearPlan("packed", f"auto: native bf16 ({isa})", "bfloat16", dots)
            assert ("read in place by bf16 dot products up to 16 rows" in bf16.describe()) == dots
            monkeypatch.setenv("IMPL_CPU_PACKED_DOTS", "0")
            assert not cpu_linear.plan(torch.bfloat16).packed_dots
            monkeypatch.delenv("IMPL_CPU_PACKED_DOTS")
            # --enable-deterministic-inference: the prepacked matmul at every row count (rows independent of the batch)
            assert cpu_linear.plan(torch.bfloat16, batch_invariant=True) == cpu_linear.LinearPlan(
                "packed", f"auto: native bf16 ({isa}), batch-invariant", "bfloat16")
        else:
            assert bf16.mode == "mkl" and bf16.reason.startswith("auto: no native bf16")
        # oneDNN held to AVX2 has no bf16 arithmetic: the float32-arithmetic kernels serve bf16 weights
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        assert not cpu_linear.native_bf16()
        assert cpu_linear.plan(torch.bfloat16) == cpu_linear.LinearPlan("mkl", "auto: no native bf16 (ONEDNN_MAX_CPU_ISA=AVX2)", "bfloat16")
        assert "float32 blocks for ATen mm" in cpu_linear.plan(torch.bfloat16).describe()
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv(cpu_linear.ENV, "mkl")
    assert cpu_linear.plan() == cpu_linear.LinearPlan("mkl", "IMPL_CPU_LINEAR=mkl")
    monkeypatch.setenv(cpu_linear.ENV, "fastest")
    with pytest.raises(ValueError, match="IMPL_CPU_LINEAR='fastest' is not one of auto, packed, onednn, mkl"):
        cpu_linear.plan()
    assert cpu_linear.sized_for_onednn(torch.empty(256, 256)) and not cpu_linear.sized_for_onednn(torch.empty(64, 512))


@needs_ext
@needs_onednn
def test_record_says_which_route_serves_which_layer(monkeypatch):
    """A model whose layers take different routes (here only the KV-shared layers count as sized for oneDNN,
    as a model with wider back-half layers would): the startup log text and /get_server_info's ``routes``
    name the layers of each route."""
    import itertools

    from impl.model.loader import load_model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    monkeypatch.setenv(cpu_linear.ENV, "packed")
    model = load_model(tiny_checkpoint("e2b"), dtype="float32")
    shared = list(range(len(model.layers) - model.config.num_kv_shared_layers, len(model.layers)))
    layer = itertools.count()  # the transform asks once per fused layer, in layer order
    monkeypatch.setattr(cpu_linear, "sized_for_onednn", lambda *ws: next(layer) >= shared[0])
    rec = cpu_fused_transform.apply(model)
    assert rec.routes() == {"fused, mkl": [i for i in range(len(model.layers)) if i not in shared], "fused, packed": shared}
    assert rec.info()["routes"] == rec.routes()
    text = rec.describe()
    assert "linear layers: oneDNN, prepacked weights (IMPL_CPU_LINEAR=packed)" in text
    assert f"; layers 0-{shared[0] - 1} keep ATen mm (weights too small for oneDNN)" in text, text
    assert model.layers[shared[0]].mlp.down_proj.weight.is_meta and not model.layers[0].mlp.down_proj.weight.is_meta
    got = _run_session(model)
    assert all(bool(v.isfinite().all()) for v in got.values())


class _RowsSeen:
    """Stands in for the extension and the attention backend: records how many rows each call gets; every output
    row is a function of its own input row only (as the kernels' rows are)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def attn_pre(self, h, *args):
        self.calls.append(("attn_pre", int(h.shape[0])))
        return h * 2, h[:, :0], h[:, :0]

    def forward(self, q, k, v, layer, fb):
        self.calls.append(("attention", int(q.shape[0])))
        return q + 1

    def decoder_post(self, h, out, *args):
        self.calls.append(("decoder_post", int(h.shape[0])))
        assert out.shape[0] == h.shape[0]
        return h + out


@pytest.mark.parametrize("rows,fast_prefill,batch_invariant,kernel_rows", [
    (1, False, False, 1),  # batch-1 decode: the one-row kernel
    (1, True, False, 2),  # fast prefill's lone LM-head row: as among the extend batch's rows
    (3, True, False, 3),
    (1, False, True, 2),  # --enable-deterministic-inference: every lone row
    (2, False, True, 2),
])
def test_a_lone_row_runs_the_kernels_as_two_and_attends_once(rows, fast_prefill, batch_invariant, kernel_rows):
    """oneDNN's one-row linear rounds unlike its multi-row kernel: where a lone row must get the bits it gets in a
    larger batch, the fused layer runs its kernels on two copies; the attention backend still sees the one row, and
    one row comes back."""
    from types import SimpleNamespace

    seen = _RowsSeen()
    att = SimpleNamespace(owns_kv=False, layer=None)
    w = SimpleNamespace(input_norm=None, post_attention_norm=None, pre_feedforward_norm=None, post_feedforward_norm=None,
                        ple=None, scalar=1.0, eps=1e-6)
    f = SimpleNamespace(qkv_proj=None, head_norm=None, q_heads=1, o_proj=None, gate_up=(), down=None, ple_gate=None,
                        ple_proj=None, onednn=False)
    layer = cpu_fused_transform.FusedLayerForward(seen, SimpleNamespace(self_attn=att), w, f, batch_invariant)
    h = torch.arange(rows * 4, dtype=torch.float32).view(rows, 4)
    cos = sin = torch.ones(rows, 1, 4)
    out = layer(h, cos, sin, None, SimpleNamespace(fast_prefill=fast_prefill, attn_backend=seen))
    assert seen.calls == [("attn_pre", kernel_rows), ("attention", rows), ("decoder_post", kernel_rows)]
    assert torch.equal(out, h + h * 2 + 1)
