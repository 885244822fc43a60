"""The hybrid sliding-window pool: its sizing, the paired allocator, the pool's rows, and the radix tree
with tombstones (matching only valid prefixes, window locks across splits, both evictions)."""

from __future__ import annotations

import pytest
import torch

from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator, kv_generation
from impl.cache.swa_pool import HybridSWAKVPool, full_layer_ids, hybrid_applies, hybrid_budget, swa_layer_ids
from impl.cache.swa_radix_cache import SWARadixCache
from tests.helpers.model import ours


def test_budget_splits_the_same_bytes_by_the_ratio():
    # E2B: 3 full layers x 512 x 2 x 2 B and 12 sliding layers x 256 x 2 x 2 B per token
    full_b, swa_b = 3 * 512 * 4, 12 * 256 * 4
    b = hybrid_budget(10_000, full_b, swa_b, 0.8)
    assert b.swa_tokens == int(b.full_tokens * 0.8)
    assert b.full_tokens * full_b + b.swa_tokens * swa_b <= 10_000 * (full_b + swa_b)
    assert (b.full_tokens + 1) * full_b + int((b.full_tokens + 1) * 0.8) * swa_b > 10_000 * (full_b + swa_b)
    assert hybrid_budget(10_000, full_b, swa_b, 1.0).full_tokens == 10_000  # ratio 1: one pool's budget
    b = hybrid_budget(0, full_b, swa_b, 0.8, full_tokens=4000)  # --max-total-tokens: the full budget, as in SGLang
    assert (b.full_tokens, b.swa_tokens, b.one_pool_tokens) == (4000, 3200, (4000 * full_b + 3200 * swa_b) // (full_b + swa_b))
    assert hybrid_budget(10_000, full_b, swa_b, 0.1).full_tokens == 24_999  # long contexts: 2.5x the tokens
    with pytest.raises(ValueError, match="--swa-full-tokens-ratio"):
        hybrid_budget(100, full_b, swa_b, 0.0)


def test_pool_rows_per_layer_type_and_writes_through_the_pairing():
    cfg = ours("e2b").config  # layers 0..14 own KV: 12 sliding, 3 full (4, 9, 14)
    assert hybrid_applies(cfg, False) and not hybrid_applies(cfg, True)
    assert full_layer_ids(cfg) == (4, 9, 14) and len(swa_layer_ids(cfg)) == 12
    pool = HybridSWAKVPool(cfg, capacity=20, swa_capacity=6, dtype=torch.float32)
    alloc = SWATokenSlotAllocator(20, 6)
    pool.register_mapping(alloc.full_to_swa)
    assert pool.get_kv_buffer(0)[0].shape[0] == 6 and pool.get_kv_buffer(4)[0].shape[0] == 20
    assert pool.full_bytes_per_token == 3 * 32 * 4 * 2 and pool.swa_bytes_per_token == 12 * 16 * 4 * 2
    slots = alloc.alloc(3)
    k = torch.randn(3, 1, 16)
    pool.set_kv_buffer(0, slots, k, -k)
    rows = alloc.full_to_swa[slots]
    assert not torch.equal(rows, slots)  # sliding-window slots are handed out from the top
    assert torch.equal(pool.get_kv_buffer(0)[0][rows], k) and pool.slot_map(0) is alloc.full_to_swa
    assert pool.slot_map(4) is None


def test_only_frees_of_slots_read_without_a_slot_map_move_the_kv_generation():
    """The CPU decode kernels keep packings of keys read without a slot map until the KV generation moves
    (tests/engine/test_decode_packings.py): every free of such slots moves it; sliding-window halves, read through
    full_to_swa, go back (every eviction interval) without dropping what full-attention layers keep."""
    a = SWATokenSlotAllocator(10, 5)
    s = a.alloc(4)
    g = kv_generation()
    a.free_swa(s[:2])
    assert kv_generation() == g
    a.free(s[2:])
    assert kv_generation() > g
    g = kv_generation()
    plain = TokenSlotAllocator(8)
    assert kv_generation() > g  # a new pool: whatever was kept of an old one's buffers goes
    g = kv_generation()
    plain.free(plain.alloc(3))
    assert kv_generation() > g


def test_allocator_pairs_frees_and_checks_both_pools():
    a = SWATokenSlotAllocator(10, 5)
    s = a.alloc(4)
    assert a.available_size() == 0 and a.full_available_size() == 5 and a.alloc(1) is None
    a.free_swa(s[:2])  # two tokens left the window: their sliding-window slots come back, full ones stay
    assert a.swa_available_size() == 2 and a.full_available_size() == 5 and bool((a.full_to_swa[s[:2]] == 0).all())
    a.check_integrity()
    a.free(s)  # both halves of the rest; the released ones only their full slot
    assert a.swa_available_size() == 4 and a.full_available_size() == 9
    a.check_integrity()
    b = a.alloc(2)
    a.full.free(b)  # a full slot freed without its pairing: the sliding-window slot would leak
    with pytest.raises(AssertionError, match="free full-attention slot still holds a sliding-window slot"):
        a.check_integrity()


W = 4  # window: a prefix of length m is usable if its last min(m, 3) tokens have sliding-window KV


def _tree(capacity=40, swa=40):
    alloc = SWATokenSlotAllocator(capacity, swa)
    return alloc, SWARadixCache(alloc, W)


def test_match_stops_where_the_window_was_freed_and_revives_tombstones():
    alloc, tree = _tree()
    key = list(range(100, 112))
    v = alloc.alloc(12)
    alloc.free_swa(v[:8])  # the request released positions 0..7 while it decoded
    tree.cache_request(key, v, owned_from=0, swa_evicted_len=8)
    tree.check_integrity()
    assert tree.evictable_size == 12 and tree.swa_evictable_size == 4
    assert tree.match_prefix(key).prefix_len == 12  # the last 3 positions have sliding-window KV
    assert tree.match_prefix(key[:10]).prefix_len == 0  # positions 7..9: 7 was released
    assert tree.match_prefix(key[:11]).prefix_len == 11  # 8..10 all live
    # a request that recomputed positions 0..9 caches them: the unlocked tombstone is revived with its slots
    w = alloc.alloc(10)
    tree.cache_request(key[:10], w, owned_from=0, swa_evicted_len=0)
    tree.check_integrity()
    assert tree.match_prefix(key[:10]).prefix_len == 10 and tree.swa_evictable_size == 12
    assert alloc.full_available_size() == 39 - 12 and alloc.swa_available_size() == 39 - 12


def test_window_lock_survives_splits_and_blocks_sliding_eviction():
    alloc, tree = _tree()
    key = list(range(1, 9))
    tree.cache_request(key, alloc.alloc(8), owned_from=0)
    m = tree.match_prefix(key)
    handle = tree.inc_lock_ref(m.last_node)
    assert tree.swa_protected_size == 8 and tree.protected_size == 8  # one node holds the last 3 tokens
    tree.match_prefix(key[:6])  # splits the locked node: the lock's end moves to the upper half
    tree.match_prefix(key[:2])
    tree.check_integrity()
    assert tree.evict_swa(100) == 0 and tree.evict(100) == 0  # locked: neither pool gives anything
    tree.dec_lock_ref(m.last_node, handle)
    tree.check_integrity()
    assert tree.swa_protected_size == 0 and tree.protected_size == 0 and tree.swa_evictable_size == 8


def test_sliding_eviction_tombstones_inner_nodes_and_full_eviction_takes_tombstones_first():
    alloc, tree = _tree()
    tree.cache_request([1, 2, 3, 4, 5, 6], alloc.alloc(6), owned_from=0)
    tree.cache_request([1, 2, 3, 9, 9, 9], alloc.alloc(6), owned_from=0)  # splits at 3; 3 duplicates freed
    tree.match_prefix([1, 2, 3, 4, 5, 6])  # the 4,5,6 leaf is the most recently used
    tree.check_integrity()
    freed = tree.evict_swa(4)  # LRU live nodes: the 9,9,9 leaf goes whole, then the shared 1,2,3 is tombstoned
    tree.check_integrity()
    assert freed == 6 and tree.swa_evictable_size == 3 and tree.match_prefix([1, 2, 3, 4, 5, 6]).prefix_len == 6
    assert tree.match_prefix([1, 2, 3, 4]).prefix_len == 0  # the tombstone ends no usable prefix
    tree.cache_request([7, 7], alloc.alloc(2), owned_from=0, swa_evicted_len=2)  # a tombstone leaf
    assert tree.evict(2) == 2 and tree.match_prefix([1, 2, 3, 4, 5, 6]).prefix_len == 6  # it went first
    tree.evict_all()
    tree.check_integrity()
    assert alloc.full_available_size() == 39 and alloc.swa_available_size() == 39
