"""Token-slot allocator: hands out KV slots ``1..capacity-1`` (slot 0 is the pad slot).

The allocator owns the free slots; the radix cache and live requests own the
rest. ``check_slot_ownership`` checks the pool-wide invariant of ``base.py``:
every slot in ``1..capacity-1`` is owned exactly once.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Mapping

import torch

# The KV generation: moves whenever any allocator in the process frees slots or starts over (a new pool, a
# flushed one), except the hybrid pool's sliding-window allocator, whose slots the kernels read only through a slot
# map. The engine writes K/V only into slots handed out from a free list, so while it stands still no slot that was
# handed out has changed its K/V: the CPU decode kernels keep a request's packed keys (read without a slot map)
# across decode steps under it (impl/kernels/cpu_attn, kv_generation) and pack only the new ones.
_GENERATIONS = itertools.count(1)
_generation = next(_GENERATIONS)


def kv_generation() -> int:
    """The process's KV generation (> 0): equal values mean no slot was freed in between."""
    return _generation


def _slots_freed() -> None:
    global _generation
    _generation = next(_GENERATIONS)


class TokenSlotAllocator:
    def __init__(self, capacity: int, device: str | torch.device = "cpu", moves_generation: bool = True):
        if capacity < 2:
            raise ValueError(f"KV pool capacity must be at least 2 slots (slot 0 is reserved), got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        # whether freeing moves the KV generation: yes, unless the kernels read these slots only through a slot map
        # (the hybrid pool's sliding-window slots), which they never keep packings of
        self.moves_generation = moves_generation
        self.clear()

    def clear(self) -> None:
        # free_slots: [n] int64, on the host (indices are bookkeeping, not data)
        self.free_slots = torch.arange(1, self.capacity, dtype=torch.int64)
        if self.moves_generation:
            _slots_freed()

    def available_size(self) -> int:
        return int(self.free_slots.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` free slots ([n] int64), or None when fewer than ``n`` are free (nothing taken)."""
        if n < 0:
            raise ValueError(f"alloc({n}): n must be >= 0")
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        self.free_slots = torch.cat([self.free_slots, slots.to(torch.int64).cpu().flatten()])
        if self.moves_generation:
            _slots_freed()

    def check_integrity(self) -> None:
        """The free list itself: in range, no pad slot, no duplicates."""
        fs = self.free_slots
        if fs.numel() == 0:
            return
        if int(fs.min()) < 1 or int(fs.max()) >= self.capacity:
            raise AssertionError(f"free list holds slots outside 1..{self.capacity - 1}")
        if torch.unique(fs).numel() != fs.numel():
            raise AssertionError("free list holds a slot twice (double free)")


def check_slot_ownership(capacity: int, owners: Mapping[str, Iterable[torch.Tensor]]) -> None:
    """Every slot in ``1..capacity-1`` is owned exactly once by the named owners.

    ``owners``: name -> tensors of slots (e.g. ``{"free": [...], "radix": [...], "req 3": [...]}``).
    Raises AssertionError naming the first leaked, double-owned or out-of-range slot.
    """
    count = torch.zeros(capacity, dtype=torch.int64)
    owners = {name: [t.to(torch.int64).cpu().flatten() for t in ts] for name, ts in owners.items()}
    for name, tensors in owners.items():
        for t in tensors:
            if t.numel() == 0:
                continue
            if int(t.min()) < 1 or int(t.max()) >= capacity:
                raise AssertionError(f"{name} owns a slot outside 1..{capacity - 1} (slot 0 is the pad slot)")
            count.index_add_(0, t, torch.ones_like(t))
    twice = torch.nonzero(count[1:] > 1).flatten()
    if twice.numel():
        slot = int(twice[0]) + 1
        who = [name for name, ts in owners.items() for t in ts if bool((t == slot).any())]
        raise AssertionError(f"KV slot {slot} is owned {int(count[slot])} times, by {who} (double free or shared ownership)")
    leaked = torch.nonzero(count[1:] == 0).flatten()
    if leaked.numel():
        raise AssertionError(f"{leaked.numel()} KV slot(s) leaked (owned by nobody), e.g. slot {int(leaked[0]) + 1}")


class SWATokenSlotAllocator:
    """The hybrid pool's allocator (SGLang's SWATokenToKVPoolAllocator): full-attention slots
    ``1..capacity-1`` and sliding-window slots ``1..swa_capacity-1``, each with its own free list, and
    ``full_to_swa[f]``: the sliding-window slot paired with full slot ``f`` (0: none).

    ``alloc(n)`` takes ``n`` slots of each and pairs them; it returns the full slots (what
    ``req_to_token`` holds; sliding layers read ``full_to_swa[slot]``). ``free(full)`` returns both
    halves; ``free_swa(full)`` only the sliding-window ones, for tokens that left every sliding layer's
    window (their full slots stay with their owner).
    """

    def __init__(self, capacity: int, swa_capacity: int, device: str | torch.device = "cpu"):
        self.full = TokenSlotAllocator(capacity, device)
        # Sliding layers read their rows through full_to_swa (the kernels' slot map), and no packing read through a
        # slot map is kept across launches: freeing these (every eviction interval) leaves the KV generation alone.
        self.swa = TokenSlotAllocator(swa_capacity, device, moves_generation=False)
        self.capacity = capacity
        self.swa_capacity = swa_capacity
        self.device = torch.device(device)
        # full_to_swa: [capacity] int64 on the pool's device (the kernels read it); slot 0 maps to 0
        self.full_to_swa = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self.clear()

    def clear(self) -> None:
        self.full.clear()
        self.swa.clear()
        # Sliding-window slots go out from the top: the pairing is never the identity, so a reader that
        # forgets the map reads wrong rows from the first token on, not only after frees reshuffle them.
        self.swa.free_slots = self.swa.free_slots.flip(0)
        self.full_to_swa.zero_()

    @property
    def free_slots(self) -> torch.Tensor:
        """The full-attention free list (the slot-ownership check's "free list")."""
        return self.full.free_slots

    def available_size(self) -> int:
        """Tokens allocatable now: each takes one slot of both pools."""
        return min(self.full.available_size(), self.swa.available_size())

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def alloc(self, n: int) -> torch.Tensor | None:
        if n < 0:
            raise ValueError(f"alloc({n}): n must be >= 0")
        if n > self.full.available_size() or n > self.swa.available_size():
            return None
        full, swa = self.full.alloc(n), self.swa.alloc(n)
        assert full is not None and swa is not None
        self.full_to_swa[full.to(self.device)] = swa.to(self.device)
        return full

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        self.free_swa(slots)
        self.full.free(slots)

    def free_swa(self, slots: torch.Tensor) -> None:
        """Return the sliding-window halves of full slots ``slots`` (those that still have one)."""
        if slots.numel() == 0:
            return
        idx = slots.to(self.device, torch.int64).flatten()
        swa = self.full_to_swa[idx]
        self.swa.free(swa[swa > 0].cpu())
        self.full_to_swa[idx] = 0

    def check_integrity(self) -> None:
        """Both free lists, and the pairing: every sliding-window slot is free or paired with exactly one
        full slot, and no free full slot keeps a pairing."""
        self.full.check_integrity()
        self.swa.check_integrity()
        m = self.full_to_swa.cpu()
        if int(m[0]) != 0:
            raise AssertionError("the pad slot 0 is paired with a sliding-window slot")
        if self.full.free_slots.numel() and bool((m[self.full.free_slots] != 0).any()):
            raise AssertionError("a free full-attention slot still holds a sliding-window slot")
        paired = m[m > 0]
        check_slot_ownership(self.swa_capacity, {"sliding-window free list": [self.swa.free_slots],
                                                 "full-slot pairings": [paired]})
