"""Compiled CPU attention kernels (impl/kernels/cpu_attn) vs the torch reference and vs the Triton
kernels under the interpreter, on the same metadata (tolerance rule: kernel_cases)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.helpers.kernel_cases import kernel_cpu_flags
from impl.kernels import cpu_attn
from impl.kernels.decode_attention import decode_attention_fwd as triton_decode
from impl.kernels.extend_attention import extend_attention_fwd as triton_extend
from impl.kernels.triton_env import TRITON_INTERPRETED
from tests.helpers.kernel_cases import assert_close_to_truth, draw_extend_shape, make_case, tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel tests here run on CPU tensors"),
    pytest.mark.skipif(cpu_attn.load() is None, reason=f"CPU attention extension unavailable: {cpu_attn.error()}"),
]


def cpu_extend(case):
    return cpu_attn.extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr,
                                         case.q_positions, case.kv_indptr, case.kv_indices, case.max_q_len,
                                         case.scaling, case.window, case.logit_cap)


def cpu_decode(case, splits):
    n = torch.tensor(splits, dtype=torch.int32)
    return cpu_attn.decode_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.q_positions,
                                         case.kv_indptr, case.kv_indices, n, max(splits), case.scaling, case.window,
                                         case.logit_cap)


def interp_extend(case):
    assert TRITON_INTERPRETED
    return triton_extend(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr, case.q_positions,
                         case.kv_indptr, case.kv_indices, case.max_q_len, case.scaling, case.window, case.logit_cap)


def interp_decode(case, splits):
    n = torch.tensor(splits, dtype=torch.int32)
    return triton_decode(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.q_positions, case.kv_indptr,
                         case.kv_indices, n, max(splits), case.scaling, case.window, case.logit_cap)


def assert_agree(cpu, interp, case, dtype):
    """Both within the tolerance of the truth, so within twice it of each other."""
    _, tol = tolerance(case, dtype)
    err = float((cpu.float() - interp.float()).abs().max()) if cpu.numel() else 0.0
    assert err <= 2 * tol, f"CPU kernel and interpreted Triton kernel differ by {err:.3g} (> {2 * tol:.3g})"


@st.composite
def extend_shapes(draw):
    return draw_extend_shape(draw, [16, 32, 64, 80, 256, 512], lambda d: 40 if d <= 80 else 12, [1, 3, 8])


@settings(max_examples=30, deadline=None, derandomize=True)  # fixed examples: a red CI reproduces
@given(extend_shapes())
@example(dict(prefix_lens=[17, 0, 5], extend_lens=[1, 20, 1], num_kv_heads=2, num_heads=6, head_dim=80,
              dtype=torch.bfloat16, seed=3, scaling=1.0, window=7, logit_cap=None))  # mixed batch, GQA group 3
def test_extend_matches_reference(shape):
    case = make_case(**shape)
    assert_close_to_truth(cpu_extend(case), case, shape["dtype"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,cap", [(None, None), (5, None), (None, 30.0)])
def test_extend_agrees_with_interpreted_triton(dtype, window, cap):
    case = make_case([6, 0, 11], [9, 14, 1], 8, 1, 32, dtype, seed=21, window=window, logit_cap=cap)
    cpu = cpu_extend(case)
    assert_close_to_truth(cpu, case, dtype)
    assert_agree(cpu, interp_extend(case), case, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_yoco_back_half_selected_rows(dtype):
    """The back half's metadata: selected rows (any row, several per request) over the full context."""
    case = make_case([4, 0, 9], [12, 7, 5], 8, 1, 64, dtype, seed=5, window=6)
    rows = [[3, 11], [6], [0, 2, 4]]
    sel = case.select(rows)
    part = cpu_extend(sel)
    assert_close_to_truth(part, sel, dtype)
    assert_agree(part, interp_extend(sel), sel, dtype)
    full = cpu_extend(case)
    starts = case.qo_indptr.tolist()
    idx = torch.tensor([starts[b] + r for b, rs in enumerate(rows) for r in rs])
    torch.testing.assert_close(part.float(), full[idx].float(), rtol=0, atol=_same_rows_tol(full, dtype))


def _same_rows_tol(full, dtype):
    return 1e-5 if dtype == torch.float32 else 2.0**-7 * float(full.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [[1, 1, 1], [2, 5, 1], [4, 4, 4]])
def test_decode_with_splits_matches_reference_and_interpreter(dtype, splits):
    case = make_case([40, 9, 0], [1, 1, 1], 8, 1, 64, dtype, seed=9, window=None, logit_cap=30.0)
    cpu = cpu_decode(case, splits)
    assert_close_to_truth(cpu, case, dtype)
    assert_agree(cpu, interp_decode(case, splits), case, dtype)


@pytest.mark.parametrize("window", [None, 300])
def test_long_context_spans_many_key_tiles(window):
    """Gemma-4 head dims (256 sliding, 512 full): 130 / 64 keys per tile, so 700 keys cross several tiles,
    and a 300-key window starts inside a tile; decode splits as well."""
    for head_dim in (256, 512):
        case = make_case([600, 0], [3, 100], 8, 1, head_dim, torch.float32, seed=head_dim, window=window)
        assert_close_to_truth(cpu_extend(case), case, torch.float32)
        last = case.select([[2], [99]])
        assert_close_to_truth(cpu_decode(last, [3, 2]), last, torch.float32)


@pytest.mark.parametrize("order", ["ascending", "descending", "scattered"])
def test_float32_keys_are_read_in_place_in_any_slot_order(order):
    """A float32 pool's rows are read where they lie, whatever order their slots come in (the hybrid pool's sliding
    slots run downwards, a decode step's new tokens interleave with other requests'): extend and decode equal the
    truth, and kv_indices read in place (contiguous int64) give the bits of an int32 or a strided copy of them."""
    case = make_case([50], [30], 4, 1, 64, torch.float32, seed=3)
    slots = {"ascending": torch.arange(1, 81), "descending": torch.arange(80, 0, -1),
             "scattered": torch.randperm(80, generator=torch.Generator().manual_seed(0)) + 1}[order]
    case.kv_indices = slots.to(torch.int64)
    out = cpu_extend(case)
    assert_close_to_truth(out, case, torch.float32)
    last = case.select([[29]])
    dec = cpu_decode(last, [2])
    assert_close_to_truth(dec, last, torch.float32)
    for other in (slots.to(torch.int32), torch.stack([case.kv_indices, case.kv_indices], 1)[:, 0]):
        assert torch.equal(cpu_extend(dataclasses.replace(case, kv_indices=other)), out)
        assert torch.equal(cpu_decode(dataclasses.replace(last, kv_indices=other), [2]), dec)


def test_a_prepared_decode_launch_gives_the_checked_launchs_bits():
    """cpu_attn.DecodeLaunch (checked once, then launched per layer) runs the same kernel call as decode_attention_fwd;
    a q it was not checked for (another layout, another shape) goes through decode_attention_fwd and its checks."""
    case = make_case([40, 9, 300], [1, 1, 1], 8, 1, 64, torch.float32, seed=9, window=None, logit_cap=30.0)
    splits = torch.tensor([2, 1, 3], dtype=torch.int32)
    launch = cpu_attn.DecodeLaunch(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.q_positions,
                                   case.kv_indptr, case.kv_indices, splits, 3, case.scaling, case.window, case.logit_cap)
    for q in (case.q, case.q * 0.5):
        want = cpu_attn.decode_attention_fwd(q, torch.empty_like(q), case.k_buf, case.v_buf, case.q_positions,
                                             case.kv_indptr, case.kv_indices, splits, 3, case.scaling, case.window,
                                             case.logit_cap)
        assert torch.equal(launch(q, torch.empty_like(q)), want)
        strided = torch.empty(q.shape[0], q.shape[1], 2 * q.shape[2]).narrow(2, 0, q.shape[2]).copy_(q)
        assert torch.equal(launch(strided, torch.empty_like(strided)), want)  # another layout: the checked path
    with pytest.raises(ValueError, match="q_positions"):
        launch(case.q[:2], torch.empty_like(case.q[:2]))  # two rows for three requests: refused by the checks


def test_query_without_visible_keys_gives_zeros():
    """kv_len shorter than a query's position + 1 is fine; a request with no keys at all yields zeros."""
    case = make_case([0, 3], [2, 2], 2, 1, 16, torch.float32, seed=4)
    case.kv_indptr = torch.tensor([0, 0, 5], dtype=torch.int32)  # request 0 sees no key
    out = cpu_extend(case)
    assert out[:2].abs().max() == 0
    assert_close_to_truth(out, case, torch.float32)


def test_bad_inputs_are_refused_with_a_message():
    case = make_case([3], [2], 2, 1, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="dtype"):
        cpu_attn.extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf.double(), case.v_buf.double(),
                                      case.qo_indptr, case.q_positions, case.kv_indptr, case.kv_indices, 2, 1.0)
    bad = case.kv_indices.clone()
    bad[0] = 10_000
    with pytest.raises(RuntimeError, match="outside the pool"):
        cpu_attn.extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr,
                                      case.q_positions, case.kv_indptr, bad, 2, 1.0)


@pytest.mark.parametrize(
    "n,heads,kv_heads,d,window,cap",
    [(32, 4, 1, 16, 16, 0.0), (6, 4, 1, 32, 0, 0.0), (9, 8, 2, 16, 5, 30.0), (4, 2, 2, 16, 3, 0.0), (5, 8, 1, 64, 0, 0.0),
     (40, 8, 1, 32, 7, 0.0)],
)
def test_rows_attention_matches_reference(n, heads, kv_heads, d, window, cap):
    """torch_native's path on CPU: each query row over its own request's keys through req_to_token (rows in
    random order, and runs of one request's consecutive positions sharing work items)."""
    from impl.kernels.reference import rows_attention_ref

    g = torch.Generator().manual_seed(7 * n + window)
    slots, reqs, ctx = 600, 6, 300
    k_buf, v_buf = torch.randn(slots, kv_heads, d, generator=g), torch.randn(slots, kv_heads, d, generator=g)
    r2t = torch.randint(0, slots, (reqs, ctx), generator=g)
    row_req = torch.randint(0, reqs, (n,), generator=g)
    q_pos = torch.randint(0, ctx, (n,), generator=g)
    q_pos[0] = 0  # a query at position 0 sees one key
    if n >= 40:  # an extend-like run: one request's positions 100..119
        row_req[10:30], q_pos[10:30] = 2, torch.arange(100, 120)
    q = torch.randn(n, heads, d, generator=g)
    got = cpu_attn.rows_attention(q, k_buf, v_buf, r2t, row_req, q_pos, window, 0.5, cap)
    want = rows_attention_ref(q, k_buf, v_buf, r2t, row_req, q_pos, window, 0.5, cap)
    # float32 rounding of sums over up to 300 keys, in an order that depends on the SIMD width (AVX2 / AVX-512)
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def test_rows_attention_rejects_bad_slots_and_positions():
    q, kv = torch.randn(1, 4, 16), torch.randn(10, 1, 16)
    r2t = torch.full((2, 8), 99, dtype=torch.int64)  # slot 99 is outside the 10-slot pool
    with pytest.raises(RuntimeError, match="KV slot 99 outside the pool"):
        cpu_attn.rows_attention(q, kv, kv, r2t, torch.tensor([0]), torch.tensor([3]), 0, 1.0)
    with pytest.raises(RuntimeError, match="query position 8 outside req_to_token's 8 columns"):
        cpu_attn.rows_attention(q, kv, kv, r2t.zero_(), torch.tensor([0]), torch.tensor([8]), 0, 1.0)
    with pytest.raises(RuntimeError, match="row_req 5 outside req_to_token's 2 rows"):
        cpu_attn.rows_attention(q, kv, kv, r2t, torch.tensor([5]), torch.tensor([1]), 0, 1.0)


# ---- bf16 pairs (extend and decode): bf16 queries over bf16 / fp8 pools, head_dim a multiple of 32, on AMX-bf16
# tiles or with AVX512-BF16's VDPBF16PS ----

def _off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("0", "false", "no", "n", "off")


def _native_build() -> bool:
    return os.environ.get("IMPL_CPU_MARCH", "native") == "native" and cpu_attn.load().simd_isa() == "avx512"


def _pairs_expected() -> str:
    """The bf16-pair path this CPU and build should run ("" for none): amx_bf16 or avx512_bf16."""
    if not _native_build() or _off("IMPL_CPU_ATTN_BF16"):
        return ""
    flags = kernel_cpu_flags()
    if "amx_bf16" in flags and not _off("IMPL_CPU_AMX"):
        return "amx_bf16"
    return "avx512_bf16" if "avx512_bf16" in flags else ""


def _tiles_expected() -> bool:
    return _pairs_expected() != ""


def _pairs_here() -> bool:
    return cpu_attn.load().extend_isa(torch.bfloat16, torch.bfloat16, 256) in ("amx_bf16", "avx512_bf16")


def test_extend_isa_names_the_tiles_where_the_cpu_has_them():
    """bf16 (and fp8 pools under bf16 queries) with head_dim % 32 == 0 run on bf16 pairs where the CPU and the build
    have them (AMX-bf16 tiles, else AVX512-BF16); float32 queries and other head dims keep the SIMD kernels."""
    ext = cpu_attn.load()
    simd = ext.simd_isa()
    tiles = _pairs_expected() or simd
    assert ext.extend_isa(torch.bfloat16, torch.bfloat16, 256) == tiles
    assert ext.extend_isa(torch.bfloat16, torch.float8_e4m3fn, 512) == tiles
    assert ext.extend_isa(torch.float32, torch.float32, 256) == simd
    assert ext.extend_isa(torch.float32, torch.bfloat16, 256) == simd
    assert ext.extend_isa(torch.bfloat16, torch.bfloat16, 80) == simd


@pytest.mark.parametrize("head_dim,window,cap", [(256, 300, None), (512, None, 30.0), (512, None, None),
                                                 (64, 45, None)])
def test_bf16_prompts_over_many_key_tiles_and_items(head_dim, window, cap):
    """The tile path's own shapes: three requests (one with a cached prefix), two KV heads, prompts that span
    several 256-key tiles and 16-row work items, a window that starts inside a tile."""
    case = make_case([150, 0, 37], [20, 560, 131], 8, 2, head_dim, torch.bfloat16, seed=head_dim + 7,
                     scaling=head_dim**-0.5, window=window, logit_cap=cap)
    assert_close_to_truth(cpu_extend(case), case, torch.bfloat16)


@pytest.mark.parametrize("window", [None, 100])
def test_a_row_alone_gets_its_bits_among_all_rows(window):
    """Fast prefill's selected rows: on the tiles a row's keys are cut on a fixed 256-key grid, so a row run
    alone equals, bit for bit, the same row run among all rows (the SIMD kernels: within rounding)."""
    case = make_case([40, 0], [260, 200], 8, 1, 256, torch.bfloat16, seed=11, scaling=256**-0.5, window=window)
    rows = [[0, 131, 259], [77, 199]]
    part = cpu_extend(case.select(rows))
    full = cpu_extend(case)
    starts = case.qo_indptr.tolist()
    idx = torch.tensor([starts[b] + r for b, rs in enumerate(rows) for r in rs])
    if _pairs_here():
        assert torch.equal(part, full[idx])
    else:
        torch.testing.assert_close(part.float(), full[idx].float(), rtol=0, atol=_same_rows_tol(full, torch.bfloat16))


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
@pytest.mark.parametrize("window,cap", [(None, None), (300, None), (None, 30.0)])
def test_a_tile_seen_whole_gets_the_masked_tiles_bits(window, cap):
    """The softmax skips the masking pass for a lane that sees every key of a tile: row 287 alone ends its keys at a
    32-key boundary (its last tile [256, 288) seen whole), among rows up to 399 the same tile is cut at 400 and
    masked for it. Both give the same bits; so does a row whose window starts inside a tile. (Row 299's last tile
    [256, 300) is padded to 320 keys: masked alone too, or the padding's zero keys would enter its softmax.)"""
    case = make_case([0], [400], 8, 1, 256, torch.bfloat16, seed=23, scaling=256**-0.5, window=window, logit_cap=cap)
    rows = [[255, 287, 299, 319, 399]]
    full = cpu_extend(case)
    for r in rows[0]:
        assert torch.equal(cpu_extend(case.select([[r]])), full[r : r + 1]), f"row {r}"
    assert_close_to_truth(full, case, torch.bfloat16)


@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 256), (torch.bfloat16, 512), (torch.float32, 256)])
def test_a_nan_key_shows_in_the_rows_that_see_it(dtype, head_dim):
    """A corrupted K row (NaN) is not silently dropped by the softmax: every row that sees the key gets NaN, the
    rows before it stay finite (bf16: the AMX tiles where the CPU has them, float32: the SIMD kernels)."""
    case = make_case([0], [300], 8, 1, head_dim, dtype, seed=31, scaling=head_dim**-0.5)
    case.k_buf[case.kv_indices[270]] = float("nan")
    out = cpu_extend(case)
    assert torch.isfinite(out[:270]).all()
    assert torch.isnan(out[270:]).all(dim=-1).all()


def _in_child(case, tmp_path, env: dict[str, str], isa: str):
    """The extend kernel's output for ``case`` in a child process under ``env`` (the switches are read once per
    process), which must run the launch on ``isa``."""
    torch.save(case, tmp_path / "case.pt")
    code = ("import sys, torch; from tests.kernels.test_cpu_attn import cpu_extend; from impl.kernels import cpu_attn; "
            "c = torch.load(sys.argv[1], weights_only=False); "
            f"assert cpu_attn.load().extend_isa(torch.bfloat16, torch.bfloat16, 512) == {isa!r}; "
            "torch.save(cpu_extend(c), sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")], check=True,
                   env=dict(os.environ, **env), cwd=ROOT, timeout=600)
    return torch.load(tmp_path / "out.pt")


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
def test_tiles_and_simd_kernels_agree(tmp_path):
    """IMPL_CPU_ATTN_BF16=0 sends the same launch to the float32 SIMD kernels (and, on an AMX CPU with AVX512-BF16,
    IMPL_CPU_AMX=0 to VDPBF16PS); every path is within the tolerance of the truth, so within twice it of the others."""
    case = make_case([30, 0], [100, 160], 8, 1, 512, torch.bfloat16, seed=5, scaling=512**-0.5, window=70)
    simd = _in_child(case, tmp_path, {"IMPL_CPU_ATTN_BF16": "0"}, cpu_attn.load().simd_isa())
    tiles = cpu_extend(case)
    assert_close_to_truth(simd, case, torch.bfloat16)
    assert_close_to_truth(tiles, case, torch.bfloat16)
    assert_agree(tiles, simd, case, torch.bfloat16)
    if _pairs_expected() == "amx_bf16" and "avx512_bf16" in kernel_cpu_flags():
        dots = _in_child(case, tmp_path, {"IMPL_CPU_AMX": "0"}, "avx512_bf16")
        assert_close_to_truth(dots, case, torch.bfloat16)
        assert_agree(tiles, dots, case, torch.bfloat16)


@pytest.mark.parametrize("head_dim,window", [(256, 100), (512, None), (32, 16)])
def test_a_row_decoded_alone_gets_its_extend_bits(head_dim, window):
    """Fast prefill's back half sends a request's one selected row to the decode kernel: with one split its output
    equals, bit for bit, the extend kernel's for that row among all rows (both kernels take the same path);
    with several splits it stays within the tolerance of the truth."""
    case = make_case([30, 0], [150, 170], 8, 1, head_dim, torch.bfloat16, seed=head_dim + 3, scaling=head_dim**-0.5,
                     window=window)
    full = cpu_extend(case)
    last = case.select([[149], [169]])
    starts = case.qo_indptr.tolist()
    idx = torch.tensor([starts[0] + 149, starts[1] + 169])
    assert torch.equal(cpu_decode(last, [1, 1]), full[idx])
    assert_close_to_truth(cpu_decode(last, [3, 2]), last, torch.bfloat16)


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
def test_a_kept_packing_serves_its_own_forward_only():
    """pack_epoch: within one forward the KV-shared layers read their producer's K/V as the producer left it, so
    launches over one buffer under one epoch reuse the first launch's bf16-pair packing (here: fast prefill's back half
    after the full extend, whose packing covers its keys), with a fresh packing's bits. A new epoch packs again:
    the pool may have been written since, as it is here."""
    case = make_case([30, 0], [150, 170], 8, 1, 256, torch.bfloat16, seed=9, scaling=256**-0.5, window=100)
    last = case.select([[149], [169]])
    n = torch.tensor([1, 1], dtype=torch.int32)

    def decode(epoch):
        return cpu_attn.decode_attention_fwd(last.q, torch.empty_like(last.q), last.k_buf, last.v_buf,
                                             last.q_positions, last.kv_indptr, last.kv_indices, n, 1, last.scaling,
                                             last.window, last.logit_cap, pack_epoch=epoch)

    epoch = cpu_attn.next_pack_epoch()
    cpu_attn.extend_attention_fwd(case.q, torch.empty_like(case.q), case.k_buf, case.v_buf, case.qo_indptr,
                                  case.q_positions, case.kv_indptr, case.kv_indices, case.max_q_len, case.scaling,
                                  case.window, case.logit_cap, pack_epoch=epoch)
    fresh = decode(0)
    assert torch.equal(decode(epoch), fresh)
    case.v_buf.mul_(2)  # written after the forward's launches: a later launch under its epoch still reads the kept tiles
    assert torch.equal(decode(epoch), fresh)
    written = decode(cpu_attn.next_pack_epoch())
    assert torch.equal(written, decode(0))
    torch.testing.assert_close(written.float(), 2 * fresh.float(), rtol=0, atol=0)


def _decode_steps(case, lens_per_step, generation):
    """Decode launches over requests whose key counts grow step by step (lens_per_step[t][r] keys of request r,
    over its first slots), each request's query at its last key: the outputs of every step."""
    base = case.kv_indptr.tolist()
    outs = []
    for lens in lens_per_step:
        idx = torch.cat([case.kv_indices[base[r]: base[r] + n] for r, n in enumerate(lens)])
        kvp = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        q = case.q[: len(lens)]
        pos = torch.tensor([n - 1 for n in lens])
        ones = torch.ones(len(lens), dtype=torch.int32)
        outs.append(cpu_attn.decode_attention_fwd(q, torch.empty_like(q), case.k_buf, case.v_buf, pos, kvp, idx, ones,
                                                  1, case.scaling, case.window, case.logit_cap,
                                                  kv_generation=generation))
    return outs


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
@pytest.mark.parametrize("head_dim,window", [(512, None), (256, 40)])
def test_decode_keeps_its_packing_across_steps_with_a_fresh_packings_bits(head_dim, window):
    """kv_generation: decode launches keep each request's packed keys and pack only the ones after them. Steps that
    cross 32-key blocks, a request joining, leaving and coming back, and the batch reordered all give the bits of
    launches that keep nothing."""
    case = make_case([0, 0, 0], [200, 200, 200], 8, 1, head_dim, torch.bfloat16, seed=head_dim + 5,
                     scaling=head_dim**-0.5, window=window)
    steps = [[30 + t, 61 + t] for t in range(5)] + [[35 + t, 66 + t, 90 + t] for t in range(3)] + [[38, 69]]
    steps += [[39, 70, 93], [40, 71, 94]]
    gen = 1 << 40  # a generation of its own: nothing kept from other tests matches it
    assert all(torch.equal(a, b) for a, b in zip(_decode_steps(case, steps, gen), _decode_steps(case, steps, 0)))
    # the requests' keys in another order: what request 0 kept is request 1's now
    swapped = _requests_reordered(case, [1, 0, 2])
    assert all(torch.equal(a, b) for a, b in zip(_decode_steps(swapped, steps, gen), _decode_steps(swapped, steps, 0)))


def _requests_reordered(case, order):
    """``case`` with its requests' key slots (kv_indices) in the request order ``order`` (same lengths)."""
    base = case.kv_indptr.tolist()
    parts = [case.kv_indices[base[r]: base[r + 1]] for r in order]
    return dataclasses.replace(case, kv_indices=torch.cat(parts))


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
def test_a_new_generation_drops_what_decode_kept():
    """Keys rewritten in place are read again only under a new generation (the engine moves it whenever a slot is
    freed: a slot's K/V is rewritten only after that); under the old one the kept tiles stand, which is why the
    engine's allocator must move it (tests/engine/test_decode_packings.py holds the engine to that)."""
    case = make_case([0, 0], [100, 100], 8, 1, 256, torch.bfloat16, seed=21, scaling=256**-0.5)
    steps = [[50, 60], [51, 61]]
    gen = (1 << 40) + 1
    kept = _decode_steps(case, steps, gen)
    case.k_buf.mul_(-1)  # every key rewritten, slots unchanged
    fresh = _decode_steps(case, steps[1:], 0)[0]
    assert not torch.equal(fresh, kept[1])
    assert torch.equal(_decode_steps(case, steps[1:], gen)[0], kept[1])  # stale: the old generation's tiles
    assert torch.equal(_decode_steps(case, steps[1:], gen + 1)[0], fresh)


@pytest.mark.skipif(not _tiles_expected(), reason="no bf16 pairs on this CPU (AMX-bf16 or AVX512-BF16)")
def test_a_refused_slot_leaves_nothing_kept_that_claims_unpacked_keys():
    """A decode launch that meets a slot outside the pool fails with a message; what it had started to keep is
    dropped, so the next launch under the same generation packs afresh instead of reading tiles never written."""
    case = make_case([0, 0], [100, 100], 8, 1, 256, torch.bfloat16, seed=23, scaling=256**-0.5)
    gen = (1 << 40) + 3
    _decode_steps(case, [[40, 50]], gen)
    bad = dataclasses.replace(case, kv_indices=case.kv_indices.clone())
    bad.kv_indices[70] = case.k_buf.shape[0] + 5  # request 0's 71st key: past the pool
    with pytest.raises(RuntimeError, match="outside the pool"):
        _decode_steps(bad, [[80, 60]], gen)
    assert all(torch.equal(a, b) for a, b in zip(_decode_steps(case, [[80, 60]], gen), _decode_steps(case, [[80, 60]], 0)))
    cpu_attn.kept_packings()  # consistent
