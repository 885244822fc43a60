"""A request's KV slots from admission to release: prefix match, growth, caching, freeing.

Ownership (see ``impl/cache/base.py``): ``req_to_token[idx, :prefix_len]`` are
radix-cache slots the request has locked; ``req_to_token[idx, prefix_len:kv_len]``
belong to the request until ``release`` hands them to the tree (radix cache on)
or back to the allocator (off).
"""

from __future__ import annotations

import torch

from impl.cache.allocator import TokenSlotAllocator, check_slot_ownership
from impl.cache.radix_cache import RadixCache
from impl.engine.req import Req


class KVLifecycle:
    def __init__(self, allocator: TokenSlotAllocator, req_to_token_pool, tree: RadixCache | None):
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.tree = tree

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def available(self) -> int:
        """Slots obtainable now: free plus evictable cached prefixes."""
        return self.allocator.available_size() + (self.tree.evictable_size if self.tree else 0)

    def alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is None and self.tree is not None:
            self.tree.evict(n - self.allocator.available_size())
            slots = self.allocator.alloc(n)
        return slots

    def match(self, req: Req) -> int:
        """Length of the cached prefix ``admit`` would reuse (no state change besides LRU)."""
        if self.tree is None:
            return 0
        return min(self.tree.match_prefix(req.fill_ids).prefix_len, req.max_prefix_len())

    def admit(self, req: Req) -> bool:
        """Give ``req`` a req_to_token row and lock its cached prefix. False if no row is free."""
        idx = self.req_to_token_pool.alloc()
        if idx is None:
            return False
        req.req_pool_idx = idx
        prefix = 0
        if self.tree is not None:
            m = self.tree.match_prefix(req.fill_ids[: req.max_prefix_len()])
            prefix = m.prefix_len
            self.tree.inc_lock_ref(m.last_node)
            req.last_node = m.last_node
            self.req_to_token_pool.req_to_token[idx, :prefix] = m.slots.to(self.req_to_token_pool.device)
        req.prefix_len = req.kv_len = prefix
        return True

    def extend(self, req: Req, n: int) -> torch.Tensor | None:
        """Allocate slots for the next ``n`` tokens of ``req`` ([n] int64), or None if memory is short."""
        slots = self.alloc(n)
        if slots is None:
            return None
        self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len : req.kv_len + n] = slots.to(
            self.req_to_token_pool.device
        )
        req.kv_len += n
        return slots

    def trim(self, req: Req, kv_len: int) -> None:
        """Free the request's slots of positions ``kv_len ..`` (rejected speculative rows)."""
        if req.req_pool_idx is None or kv_len >= req.kv_len:
            return
        assert kv_len >= req.prefix_len, "trim would free slots the radix cache owns"
        self.allocator.free(self.req_to_token_pool.req_to_token[req.req_pool_idx, kv_len : req.kv_len].to("cpu", torch.int64))
        req.kv_len = kv_len

    def release(self, req: Req) -> None:
        """Finished, aborted or retracted: cache the computed tokens (radix on) or free them."""
        if req.req_pool_idx is None:
            return
        # K/V past the request's tokens (speculative rows of a request that finished midway) is freed.
        self.trim(req, req.seq_len)
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to("cpu", torch.int64)
        if self.tree is not None:
            # KV exists for fill_ids[:kv_len]; the tree keeps what it lacks, the duplicates are freed.
            new_prefix = self.tree.insert(req.fill_ids[: req.kv_len], kv)
            self.allocator.free(kv[req.prefix_len : new_prefix])
            self.tree.dec_lock_ref(req.last_node)
        else:
            self.allocator.free(kv[req.prefix_len :])
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.kv_len, req.prefix_len, req.last_node = None, 0, 0, None

    def discard(self, req: Req) -> None:
        """A failed request: free its own slots without caching them (their KV may never have been written)."""
        if req.req_pool_idx is None:
            return
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to("cpu", torch.int64)
        self.allocator.free(kv[req.prefix_len :])
        if self.tree is not None:
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.kv_len, req.prefix_len, req.last_node = None, 0, 0, None

    def owned_slots(self, req: Req) -> torch.Tensor:
        if req.req_pool_idx is None:
            return torch.empty(0, dtype=torch.int64)
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, req.prefix_len : req.kv_len].to("cpu")

    def check_integrity(self, live: list[Req], idle: bool = False) -> None:
        """Every slot owned exactly once (free list / radix tree / live request); when idle,
        no request rows in use and no radix locks held."""
        self.allocator.check_integrity()
        self.req_to_token_pool.check_integrity()
        owners: dict[str, list[torch.Tensor]] = {"free list": [self.allocator.free_slots]}
        if self.tree is not None:
            self.tree.check_integrity()
            owners["radix cache"] = self.tree.all_slots()
        for r in live:
            owners[f"request {r.rid}"] = [self.owned_slots(r)]
        check_slot_ownership(self.capacity, owners)
        if idle:
            if self.req_to_token_pool.available_size() != self.req_to_token_pool.size:
                raise AssertionError("engine idle but some req_to_token rows are still allocated (leaked request)")
            if self.tree is not None and self.tree.protected_size != 0:
                raise AssertionError(f"engine idle but {self.tree.protected_size} cached tokens are still locked")
