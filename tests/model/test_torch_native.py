"""TorchNativeAttnBackend against a per-row brute-force attention over the same pool."""

from __future__ import annotations

import math

import pytest
import torch

from impl.attention.base import AttentionLayer
from tests.helpers.model import ours
from tests.helpers.session import Session


def _brute(q, k_buf, v_buf, r2t, fb, rows, layer):
    """Row by row: query at position p of request i sees keys 0..p (and > p - W when sliding)."""
    out = []
    starts = fb.extend_start_loc_cpu
    for qi, row in enumerate(rows):
        i = max(j for j, s in enumerate(starts) if s <= row)
        p = int(fb.positions[row])
        lo = 0 if layer.sliding_window is None else max(0, p - layer.sliding_window + 1)
        slots = r2t[int(fb.req_pool_indices[i]), lo : p + 1]
        k, v = k_buf[slots], v_buf[slots]  # [n, Hkv, D]
        g = layer.num_heads // layer.num_kv_heads
        qh = q[qi].view(layer.num_heads, layer.head_dim)
        heads = []
        for h in range(layer.num_heads):
            s = (k[:, h // g] @ qh[h]) * layer.scaling
            if layer.logit_cap:
                s = torch.tanh(s / layer.logit_cap) * layer.logit_cap
            heads.append(torch.softmax(s, 0) @ v[:, h // g])
        out.append(torch.cat(heads))
    return torch.stack(out)


@pytest.mark.parametrize("path", ["rows_kernel", "torch_ops"])
@pytest.mark.parametrize("verify", [False, True], ids=["extend", "spec_verify"])
@pytest.mark.parametrize("window,cap", [(None, None), (5, None), (5, 3.0)])
def test_extend_decode_and_cross_rows_match_brute_force(window, cap, verify, path):
    """spec_verify: the same rows run one by one (a verify batch's decode-row path) give the same result.
    Both CPU paths: the compiled rows kernel (impl/kernels/cpu_attn) and the torch ops (bands, windows,
    SDPA segments) that serve where it is not built."""
    model = ours("noshare")  # pools sized for layer 0: 2 KV heads, head_dim 16
    s = Session(model)
    layer = AttentionLayer(0, 0, num_heads=4, num_kv_heads=2, head_dim=16, scaling=1 / math.sqrt(16), sliding_window=window, logit_cap=cap)
    g = torch.Generator().manual_seed(0)
    s.step([("a", list(range(3, 12))), ("b", [5, 6])])  # fill some prefix KV
    fb = s.build([("a", [7]), ("b", list(range(20, 33))), ("c", [9, 10, 11])], all_logits=True)
    fb.spec_verify = verify
    t = fb.num_tokens
    q, k, v = (torch.randn(t, n, generator=g) for n in (64, 32, 32))
    be = s.backend
    if path == "rows_kernel" and not be._rows_kernel:
        pytest.skip("compiled CPU attention kernels not built here")
    be._rows_kernel = path == "rows_kernel"
    be.init_forward_metadata(fb)
    assert bool(be.forward_plan.band_groups) != verify  # verify rows take the row path, not bands
    got = be.forward(q, k, v, layer, fb)
    k_buf, v_buf = s.kv_pool.get_kv_buffer(0)
    want = _brute(q, k_buf, v_buf, s.req_pool.req_to_token, fb, list(range(t)), layer)
    assert (got - want).abs().max().item() < 1e-5
    # YOCO back half: only rows [0, 6, 13, 15] as queries, no K/V passed or written
    rows = torch.tensor([0, 6, 13, 15])
    fb.fast_prefill = True
    before = k_buf.clone()
    be.init_cross_decoder_metadata(fb, rows, [1, 2, 1])
    got = be.forward(q[rows], None, None, AttentionLayer(5, 0, 4, 2, 16, 0.25, window, cap), fb)
    want = _brute(q[rows], k_buf, v_buf, s.req_pool.req_to_token, fb, rows.tolist(), AttentionLayer(5, 0, 4, 2, 16, 0.25, window, cap))
    assert (got - want).abs().max().item() < 1e-5 and torch.equal(before, k_buf)


def test_row_count_mismatch_is_a_clear_error():
    s = Session(ours("noshare"))
    fb = s.build([("a", [3, 4, 5])])
    s.backend.init_forward_metadata(fb)
    with pytest.raises(ValueError, match="metadata covers 3 rows but layer 0 passed 2"):
        s.backend.forward(torch.zeros(2, 64), None, None, AttentionLayer(0, 0, 4, 2, 16), fb)
