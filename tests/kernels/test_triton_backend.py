"""TritonAttnBackend gives the same outputs as TorchNativeAttnBackend on random paged batches,
including mixed batches, decode batches and the YOCO back half (cross-decoder metadata)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.attention.base import AttentionLayer
from impl.attention.torch_native import TorchNativeAttnBackend
from impl.attention.triton_backend import TritonAttnBackend
from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from impl.config.model_config import ModelConfig
from impl.forward_batch import ForwardBatch, ForwardMode
from tests.helpers.kernel_cases import DEVICE

WINDOW = 5
# 4 layers: sliding, full (KV owners), then their KV-shared copies; full layers have a larger head_dim.
CONFIG = ModelConfig.from_hf_dict(dict(
    model_type="gemma4_text", num_hidden_layers=4, num_kv_shared_layers=2, hidden_size=64, vocab_size=100,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    head_dim=32, global_head_dim=64, num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
))


def layers(logit_cap=None) -> list[AttentionLayer]:
    c = CONFIG
    return [
        AttentionLayer(i, c.kv_producer[i], c.num_attention_heads, c.layer_num_kv_heads[i], c.layer_head_dims[i],
                       scaling=1.0, sliding_window=c.sliding_window if c.is_sliding(i) else None, logit_cap=logit_cap)
        for i in range(c.num_hidden_layers)
    ]


class World:
    """One KV pool and request table shared by both backends, and a batch over them."""

    def __init__(self, prefix: list[int], extend: list[int], seed: int):
        g = torch.Generator().manual_seed(seed)
        seq = [p + e for p, e in zip(prefix, extend)]
        capacity = 1 + sum(seq) + 3
        self.pool = TokenToKVPool(CONFIG, capacity, torch.float32, DEVICE)
        for i in CONFIG.kv_layer_ids:  # cached prefixes (and garbage elsewhere): random K/V everywhere
            k, v = self.pool.get_kv_buffer(i)
            k.copy_(torch.randn(k.shape, generator=g))
            v.copy_(torch.randn(v.shape, generator=g))
        self.r2t = ReqToTokenPool(len(seq) + 1, max(seq) + 1, DEVICE)
        slots = (torch.randperm(capacity - 1, generator=g) + 1).to(DEVICE)
        rows, new_slots, acc = [], [], 0
        for p, n in zip(prefix, seq):
            r = self.r2t.alloc()
            self.r2t.req_to_token[r, :n] = slots[acc : acc + n]
            new_slots.append(slots[acc + p : acc + n])
            rows.append(r)
            acc += n
        t = torch.tensor
        self.fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE if all(e == 1 for e in extend) else ForwardMode.EXTEND,
            input_ids=torch.zeros(sum(extend), dtype=torch.long, device=DEVICE),
            positions=torch.cat([torch.arange(p, p + e) for p, e in zip(prefix, extend)]).to(DEVICE),
            req_pool_indices=t(rows, device=DEVICE), seq_lens=t(seq, device=DEVICE),
            extend_prefix_lens=t(prefix, device=DEVICE), extend_seq_lens=t(extend, device=DEVICE),
            out_cache_loc=torch.cat(new_slots), logits_indices=t(self.fb_last(extend), device=DEVICE),
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool,
        )
        self.g = g
        self.triton = TritonAttnBackend(CONFIG, self.pool, self.r2t, DEVICE)
        self.native = TorchNativeAttnBackend(CONFIG, self.pool, self.r2t, DEVICE)

    @staticmethod
    def fb_last(extend):
        out, acc = [], 0
        for e in extend:
            acc += e
            out.append(acc - 1)
        return out

    def rand(self, n: int, heads: int, dim: int) -> torch.Tensor:
        return torch.randn(n, heads * dim, generator=self.g).to(DEVICE)

    def run_layers(self, logit_cap=None) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every layer on every row through both backends: {layer: (q, triton out, native out)}."""
        self.triton.init_forward_metadata(self.fb)
        self.native.init_forward_metadata(self.fb)
        out, n = {}, self.fb.num_tokens
        for layer in layers(logit_cap):
            q = self.rand(n, layer.num_heads, layer.head_dim)
            k = v = None
            if not layer.is_kv_shared:
                k, v = self.rand(n, layer.num_kv_heads, layer.head_dim), self.rand(n, layer.num_kv_heads, layer.head_dim)
            out[layer.layer_id] = (q, self.triton.forward(q, k, v, layer, self.fb), self.native.forward(q, k, v, layer, self.fb))
        return out


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix,extend", [
    ([0, 7, 3], [6, 1, 9]),  # mixed: a fresh prompt, a 1-token extend, a prefix hit; contexts > window
    ([4, 0, 11], [1, 1, 1]),  # decode batch (split-KV kernel)
    ([0], [1]),  # 1-token prompt
])
def test_triton_matches_torch_native(prefix, extend):
    w = World(prefix, extend, seed=sum(prefix) + len(extend))
    for layer_id, (_, tri, nat) in w.run_layers().items():
        assert tri.shape == nat.shape
        assert_same(tri, nat)


def test_logit_cap_matches_torch_native():
    w = World([2, 5], [8, 3], seed=4)
    for _, tri, nat in w.run_layers(logit_cap=3.0).values():
        assert_same(tri, nat)


@st.composite
def cross_batches(draw):
    batch = draw(st.integers(1, 3))
    prefix = [draw(st.integers(0, 9)) for _ in range(batch)]
    extend = [draw(st.integers(1, 9)) for _ in range(batch)]
    # the last row of each request, plus (for prompt logprobs) every row from some start
    starts = [draw(st.integers(0, e - 1)) for e in extend]
    return prefix, extend, starts, draw(st.integers(0, 999))


@settings(max_examples=8, deadline=None, derandomize=True)  # fixed examples: a red CI reproduces
@given(cross_batches())
def test_cross_decoder_metadata_matches_torch_native_and_full_pass(case):
    prefix, extend, starts, seed = case
    w = World(prefix, extend, seed)
    full = w.run_layers()  # self-decoder wrote every new row's K/V; shared layers ran on all rows
    base = w.fb.extend_start_loc_cpu
    rows_per_req = [e - s for e, s in zip(extend, starts)]
    rows = torch.tensor([base[i] + r for i, (s, e) in enumerate(zip(starts, extend)) for r in range(s, e)], device=DEVICE)
    w.fb.fast_prefill = True
    w.triton.init_cross_decoder_metadata(w.fb, rows, rows_per_req)
    w.native.init_cross_decoder_metadata(w.fb, rows, rows_per_req)
    assert w.triton.cross_metadata.use_decode_kernel == all(n == 1 for n in rows_per_req)
    for layer in layers():
        if not layer.is_kv_shared:
            continue
        q_full = full[layer.layer_id][0]
        q = q_full.index_select(0, rows)  # the gathered rows' queries
        tri = w.triton.forward(q, None, None, layer, w.fb)
        assert_same(tri, w.native.forward(q, None, None, layer, w.fb))
        assert_same(tri, full[layer.layer_id][1].index_select(0, rows))  # YOCO: same as the full pass at those rows


def test_shared_layer_without_cross_metadata_is_a_clear_error():
    w = World([3], [4], seed=9)
    w.triton.init_forward_metadata(w.fb)
    w.fb.fast_prefill = True
    layer = layers()[2]
    with pytest.raises(ValueError, match="init_cross_decoder_metadata"):
        w.triton.forward(w.rand(1, layer.num_heads, layer.head_dim), None, None, layer, w.fb)


def test_cross_metadata_rejects_mismatched_counts():
    w = World([3, 1], [4, 2], seed=10)
    w.triton.init_forward_metadata(w.fb)
    with pytest.raises(ValueError, match="rows_per_req"):
        w.triton.init_cross_decoder_metadata(w.fb, torch.tensor([3, 5], device=DEVICE), [1, 2])


@pytest.mark.parametrize("lens", [[3, 0, 7, 1], [5], [0, 0]])
def test_kv_indices_are_each_requests_slots_in_order(lens):
    """build_kv_indices (one 1-D gather from the flattened request table): request b's slots of positions
    0..len_b - 1, requests in batch order, whatever rows of the table they hold; a sliced table works too."""
    from impl.attention.triton_metadata import build_kv_indices

    g = torch.Generator().manual_seed(3)
    table = torch.randint(0, 1000, (6, 9), generator=g, dtype=torch.int64)
    rows = torch.tensor([4, 1, 5, 0][: len(lens)], dtype=torch.int32)
    for t in (table, table[:, :8]):  # (a view with a row stride wider than its rows)
        indptr, idx = build_kv_indices(t, rows, lens)
        assert indptr.tolist() == [sum(lens[:b]) for b in range(len(lens) + 1)]
        want = [int(t[r, p]) for r, n in zip(rows.tolist(), lens) for p in range(n)]
        assert idx.tolist() == want and idx.dtype == torch.int64
