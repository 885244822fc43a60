"""Radix prefix cache: matching, splitting, insertion ownership, locking and LRU eviction."""

import pytest

from impl.cache.allocator import TokenSlotAllocator, check_slot_ownership
from impl.cache.radix_cache import RadixCache


def _setup(cap=32):
    a = TokenSlotAllocator(cap)
    return a, RadixCache(a)


def _insert(a, tree, key):
    slots = a.alloc(len(key))
    done = tree.insert(key, slots)
    a.free(slots[:done])  # the part the tree already had
    return slots


def test_match_returns_slots_of_longest_prefix_and_splits():
    a, tree = _setup()
    s = _insert(a, tree, [1, 2, 3, 4])
    m = tree.match_prefix([1, 2, 9])
    assert m.prefix_len == 2 and m.slots.tolist() == s[:2].tolist()
    assert tree.cached_sequences() == {(1, 2, 3, 4): s.tolist()}
    assert tree.match_prefix([7]).prefix_len == 0
    tree.check_integrity()


def test_insert_reports_overlap_so_caller_frees_duplicates():
    a, tree = _setup()
    s1 = _insert(a, tree, [1, 2, 3])
    s2 = a.alloc(5)
    assert tree.insert([1, 2, 3, 8, 9], s2) == 3
    a.free(s2[:3])
    seqs = tree.cached_sequences()
    assert seqs[(1, 2, 3, 8, 9)] == s1.tolist() + s2[3:].tolist()
    check_slot_ownership(32, {"free": [a.free_slots], "tree": tree.all_slots()})
    tree.check_integrity()


def test_locked_prefix_survives_eviction_and_lru_order():
    a, tree = _setup()
    _insert(a, tree, [1, 2, 3])
    _insert(a, tree, [5, 6])
    _insert(a, tree, [7])
    tree.match_prefix([5, 6])  # touch: now [1,2,3] is least recently used
    m = tree.match_prefix([7])
    tree.inc_lock_ref(m.last_node)
    assert tree.protected_size == 1 and tree.evictable_size == 5
    assert tree.evict(1) == 3  # the LRU leaf [1,2,3] goes whole
    assert set(tree.cached_sequences()) == {(5, 6), (7,)}
    assert tree.evict(100) == 2  # [7] is locked
    assert set(tree.cached_sequences()) == {(7,)}
    tree.dec_lock_ref(m.last_node)
    assert tree.evict(0) == 0
    assert tree.evict_all() == 1 and a.available_size() == 31
    tree.check_integrity()


def test_unbalanced_unlock_is_caught():
    a, tree = _setup()
    _insert(a, tree, [1, 2])
    node = tree.match_prefix([1, 2]).last_node
    with pytest.raises(AssertionError, match="unbalanced"):
        tree.dec_lock_ref(node)


def test_split_keeps_locks_on_both_halves():
    a, tree = _setup()
    _insert(a, tree, [1, 2, 3, 4])
    node = tree.match_prefix([1, 2, 3, 4]).last_node
    tree.inc_lock_ref(node)
    tree.match_prefix([1, 2])  # splits the locked edge
    tree.check_integrity()
    assert tree.protected_size == 4
    tree.dec_lock_ref(node)
    assert tree.protected_size == 0 and tree.evictable_size == 4
    tree.check_integrity()
