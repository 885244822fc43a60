"""Slot allocator: slot 0 never handed out, all-or-nothing alloc, integrity catches leaks and double frees."""

import pytest
import torch

from impl.cache.allocator import TokenSlotAllocator, check_slot_ownership


def test_alloc_never_hands_out_pad_slot_and_is_all_or_nothing():
    a = TokenSlotAllocator(6)
    assert a.available_size() == 5
    got = a.alloc(5)
    assert sorted(got.tolist()) == [1, 2, 3, 4, 5]
    assert a.alloc(1) is None
    a.free(got[:2])
    assert a.alloc(3) is None and a.available_size() == 2
    a.check_integrity()
    check_slot_ownership(6, {"free": [a.free_slots], "req": [got[2:]]})


def test_ownership_check_names_leak_and_double_owner():
    a = TokenSlotAllocator(5)
    got = a.alloc(2)
    with pytest.raises(AssertionError, match="leaked"):
        check_slot_ownership(5, {"free": [a.free_slots]})
    a.free(got)
    a.free(got[:1])  # double free
    with pytest.raises(AssertionError, match="double free"):
        a.check_integrity()
    with pytest.raises(AssertionError, match=r"owned 2 times"):
        check_slot_ownership(5, {"free": [a.free_slots]})


def test_pad_slot_ownership_is_an_error():
    with pytest.raises(AssertionError, match="pad slot"):
        check_slot_ownership(3, {"x": [torch.tensor([0, 1, 2])]})


def test_bad_sizes_raise_value_error():
    with pytest.raises(ValueError, match="capacity"):
        TokenSlotAllocator(1)
    with pytest.raises(ValueError):
        TokenSlotAllocator(4).alloc(-1)
