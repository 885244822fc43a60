"""TokenToKVPool and ReqToTokenPool: per-layer shapes, producers only, and row bookkeeping."""

from __future__ import annotations

import pytest
import torch

from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from tests.helpers.model import ours


def test_only_producer_layers_hold_kv_with_their_own_shapes():
    cfg = ours("e2b").config
    pool = TokenToKVPool(cfg, capacity=64, dtype=torch.float32, device="cpu")
    assert pool.num_kv_layers == 15 and sorted(pool.k_buffers) == list(range(15))
    assert pool.get_kv_buffer(13)[0].shape == (64, 1, 16)  # sliding producer
    assert pool.get_kv_buffer(14)[1].shape == (64, 1, 32)  # full producer: global_head_dim
    # 12 sliding layers x 16 + 3 full x 32, K and V, 1 head, 4 bytes
    assert pool.bytes_per_token == 2 * 4 * (12 * 16 + 3 * 32)
    assert pool.size == 63  # slot 0 is the pad slot
    with pytest.raises(ValueError, match="layer 20 owns no KV buffer"):
        pool.get_kv_buffer(20)


def test_set_kv_buffer_writes_rows_at_slots():
    cfg = ours("k_eq_v").config
    pool = TokenToKVPool(cfg, capacity=8, dtype=torch.float32, device="cpu")
    heads, d = cfg.layer_num_kv_heads[4], cfg.layer_head_dims[4]
    k = torch.randn(2, heads, d)
    pool.set_kv_buffer(4, torch.tensor([3, 6]), k, -k)
    kb, vb = pool.get_kv_buffer(4)
    assert torch.equal(kb[3], k[0]) and torch.equal(vb[6], -k[1]) and kb[0].abs().sum() == 0


def test_req_to_token_pool_alloc_free_integrity():
    pool = ReqToTokenPool(size=2, max_context_len=16)
    a, b = pool.alloc(), pool.alloc()
    assert {a, b} == {0, 1} and pool.alloc() is None
    pool.req_to_token[a, :3] = torch.tensor([5, 6, 7])
    pool.check_integrity()
    pool.free(a)
    assert pool.req_to_token[a].abs().sum() == 0 and pool.available_size() == 1
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(a)
    pool.check_integrity()
    assert pool.req_to_token.shape == (2, 16) and pool.req_to_token.dtype == torch.int64
