"""KV-cache interfaces and their invariants.

``ReqToTokenPool``: ``req_to_token[r, j]`` is the KV slot of token ``j`` of the
request in row ``r``. ``TokenToKVPool``: per KV-owning layer a K and a V buffer
``[capacity, num_kv_heads, head_dim]`` (sliding and full layers may differ in
heads and head_dim); KV-shared layers own no buffer and are served their
producer's (``get_kv_buffer(layer.kv_layer_id)``). Slot 0 is reserved as a pad
slot and never handed out. The allocator owns the free slots; the radix cache
owns slots of cached prefixes; a request owns the rest of its slots.

Invariant checked by ``check_integrity()`` on every owner: every slot in
``1..capacity-1`` is owned exactly once (free list, radix tree, or a live
request); none leaked, none double-freed. ``evict(0)`` is always safe.

The hybrid sliding-window pool (``swa_pool.py``) has a second slot space for its
sliding-window layers: each full slot pairs with at most one sliding-window slot
(``slot_map``), and every sliding-window slot is free or paired exactly once; a
live request's window positions are always paired, a radix tombstone's never.
fp8 pools store ``value / scale`` (``get_kv_scales``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch


class SlotAllocator(Protocol):
    """The free KV slots (``allocator.py``: ``TokenSlotAllocator``; the hybrid pool's ``SWATokenSlotAllocator``, whose
    ``free`` also gives back the paired sliding-window slots): what a prefix cache frees into."""

    def available_size(self) -> int: ...

    def alloc(self, n: int) -> torch.Tensor | None: ...

    def free(self, slots: torch.Tensor) -> None: ...


class TokenToKVPoolBase(ABC):
    capacity: int

    @abstractmethod
    def get_kv_buffer(self, kv_layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v), each ``[capacity, num_kv_heads, head_dim]`` of the producer layer."""

    @abstractmethod
    def set_kv_buffer(self, kv_layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write rows ``k``/``v`` ``[n, num_kv_heads, head_dim]`` at slots ``loc`` ``[n]`` (fp8 pools:
        ``value / scale``, saturated)."""

    @abstractmethod
    def get_kv_scales(self, kv_layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale): a reader dequantises a stored element as ``element * scale``."""

    @abstractmethod
    def slot_map(self, kv_layer_id: int) -> torch.Tensor | None:
        """[capacity] int64: the buffer row of each slot for this layer (None: the slot itself)."""

    @property
    @abstractmethod
    def bytes_per_token(self) -> int: ...

    @property
    @abstractmethod
    def num_kv_layers(self) -> int: ...
