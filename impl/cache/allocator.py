"""Token-slot allocator: hands out KV slots ``1..capacity-1`` (slot 0 is the pad slot).

The allocator owns the free slots; the radix cache and live requests own the
rest. ``check_slot_ownership`` checks the pool-wide invariant of ``base.py``:
every slot in ``1..capacity-1`` is owned exactly once.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch


class TokenSlotAllocator:
    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        if capacity < 2:
            raise ValueError(f"KV pool capacity must be at least 2 slots (slot 0 is reserved), got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        # free_slots: [n] int64, on the host (indices are bookkeeping, not data)
        self.free_slots = torch.arange(1, self.capacity, dtype=torch.int64)

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
