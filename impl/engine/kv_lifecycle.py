"""A request's KV slots from admission to release: prefix match, growth, caching, freeing.

Ownership (see ``impl/cache/base.py``): ``req_to_token[idx, :prefix_len]`` are
radix-cache slots the request has locked; ``req_to_token[idx, prefix_len:kv_len]``
belong to the request until ``release`` hands them to the tree (radix cache on)
or back to the allocator (off).

The modes differ on two axes, each a small strategy chosen once here: prefix sharing (``kv_prefix.py``:
the radix cache or none) and the pool (``kv_pools.py``: one pool, or the hybrid sliding-window pool, whose
module says when a request's out-of-window tokens give their sliding-window slots back). The request's
life below is the same in every mode.
"""

from __future__ import annotations

from typing import Sequence

import torch

from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator, check_slot_ownership
from impl.cache.radix_cache import RadixCache
from impl.cache.swa_request_cap import SWARequestCap, swa_eviction_interval
from impl.engine.kv_pools import HybridSWAPool, KVPool, OnePool
from impl.engine.kv_prefix import NoPrefixCache, PrefixCache, RadixPrefixCache
from impl.engine.req import Req


class KVLifecycle:
    def __init__(self, allocator: TokenSlotAllocator | SWATokenSlotAllocator, req_to_token_pool,
                 tree: RadixCache | None, sliding_window: int | None = None, swa_cap: SWARequestCap | None = None,
                 eviction_interval: int | None = None):
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.tree = tree
        self.live: dict[int, Req] = {}  # admitted requests by req_to_token row
        self.prefix: PrefixCache = NoPrefixCache(allocator) if tree is None else RadixPrefixCache(tree)
        self.pool: KVPool
        if isinstance(allocator, SWATokenSlotAllocator):
            self.pool = HybridSWAPool(allocator, self.prefix, req_to_token_pool, self.live, int(sliding_window or 0),
                                      shares_prefixes=tree is not None, swa_cap=swa_cap,
                                      eviction_interval=int(eviction_interval or swa_eviction_interval()))
        elif swa_cap is not None:
            raise ValueError("the sliding-window request cap needs the hybrid pool without the radix cache")
        else:
            self.pool = OnePool(allocator, self.prefix)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def hybrid(self) -> bool:
        return self.pool.hybrid

    @property
    def window(self) -> int:
        return self.pool.window

    # ---- budgets (the pool's) -----------------------------------------------------------
    def full_available(self) -> int:
        """Full-attention slots obtainable now: free plus evictable cached prefixes."""
        return self.pool.full_available()

    def swa_available(self) -> int:
        """Sliding-window slots obtainable now (the full count for one pool)."""
        return self.pool.swa_available()

    def available(self) -> int:
        """Tokens allocatable now (each takes a slot of every pool)."""
        return self.pool.available()

    def fits(self, n: int, future: Sequence[int], ratio: float) -> bool:
        """``n`` new tokens fit in every pool beside a reserve for ``future`` decode tokens (one count per
        request; ``ratio`` of them are reserved, SGLang's new_token_ratio)."""
        return self.pool.fits(n, future, ratio)

    def max_chunk(self, n: int) -> int:
        """The largest prefill chunk up to ``n`` tokens the pool can take now."""
        return self.pool.max_chunk(n)

    def window_start(self, req: Req) -> int:
        """The lowest position a later query of ``req`` may read (0 without a sliding-window pool)."""
        return self.pool.window_start(req)

    def new_batch(self) -> None:
        """Scheduling starts: the previous forward is done, so every request's next query is at its kv_len
        (the hybrid pool without the radix cache frees out-of-window tokens now)."""
        for req in self.live.values():
            req.swa_query_from = req.kv_len
        self.pool.new_batch()

    def alloc(self, n: int) -> torch.Tensor | None:
        return self.pool.alloc(n)

    # ---- a request's life -------------------------------------------------------
    def match(self, req: Req) -> int:
        """Length of the cached prefix ``admit`` would reuse (no state change besides LRU)."""
        return self.prefix.match(req)

    def admit(self, req: Req) -> bool:
        """Give ``req`` a req_to_token row and lock its cached prefix. False if no row is free, or if the
        request cap cannot take its worst case now."""
        if not self.pool.admits(req):
            return False
        idx = self.req_to_token_pool.alloc()
        if idx is None:
            return False
        req.req_pool_idx = idx
        slots = self.prefix.lock(req)
        prefix = int(slots.numel())
        self.req_to_token_pool.req_to_token[idx, :prefix] = slots.to(self.req_to_token_pool.device)
        req.prefix_len = req.kv_len = req.swa_evicted_len = req.swa_query_from = prefix
        self.live[idx] = req
        return True

    def extend(self, req: Req, n: int) -> torch.Tensor | None:
        """Allocate slots for the next ``n`` tokens of ``req`` ([n] int64), or None if memory is short."""
        req.swa_query_from = req.kv_len  # this forward's queries start here
        slots = self.alloc(n)
        if slots is None:
            return None
        self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len : req.kv_len + n] = slots.to(
            self.req_to_token_pool.device
        )
        req.kv_len += n
        return slots

    def extend_each(self, reqs: list[Req]) -> list[torch.Tensor] | None:
        """``extend(req, 1)`` for every request of a decode step at once: one allocation and one ``req_to_token``
        write for the batch instead of one each (a 32-request step made 32 of both). [1] int64 slots per request,
        or None if memory is short (nothing taken)."""
        if not reqs:
            return []
        slots = self.alloc(len(reqs))
        if slots is None:
            return None
        dev = self.req_to_token_pool.device
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=dev)
        cols = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64, device=dev)
        self.req_to_token_pool.req_to_token[rows, cols] = slots.to(dev)
        for r in reqs:
            r.swa_query_from = r.kv_len  # this forward's query starts here
            r.kv_len += 1
        return list(slots.split(1))

    def trim(self, req: Req, kv_len: int) -> None:
        """Free the request's slots of positions ``kv_len ..`` (rejected speculative rows)."""
        if req.req_pool_idx is None or kv_len >= req.kv_len:
            return
        assert kv_len >= req.prefix_len, "trim would free slots the radix cache owns"
        self.allocator.free(self.req_to_token_pool.req_to_token[req.req_pool_idx, kv_len : req.kv_len].to("cpu", torch.int64))
        req.kv_len = kv_len
        req.swa_evicted_len = min(req.swa_evicted_len, kv_len)
        req.swa_query_from = min(req.swa_query_from, kv_len)

    def release(self, req: Req) -> None:
        """Finished, aborted or retracted: cache the computed tokens (radix on) or free them."""
        if req.req_pool_idx is None:
            return
        # K/V past the request's tokens (speculative rows of a request that finished midway) is freed.
        self.trim(req, req.seq_len)
        self.prefix.cache(req, self._row(req))
        self._forget(req)

    def discard(self, req: Req) -> None:
        """A failed request: free its own slots without caching them (their KV may never have been written)."""
        if req.req_pool_idx is None:
            return
        self.allocator.free(self._row(req)[req.prefix_len :])
        self.prefix.unlock(req)
        self._forget(req)

    def flush(self) -> None:
        """Drop every cached prefix (no request may be in flight)."""
        self.prefix.flush()

    def _row(self, req: Req) -> torch.Tensor:
        """The request's slots of positions ``0 .. kv_len - 1`` ([kv_len] int64 on the CPU)."""
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to("cpu", torch.int64)

    def _forget(self, req: Req) -> None:
        idx = req.pool_idx
        self.live.pop(idx, None)
        self.req_to_token_pool.free(idx)
        req.req_pool_idx, req.kv_len, req.prefix_len, req.last_node = None, 0, 0, None
        req.swa_evicted_len, req.swa_lock = 0, None

    def owned_slots(self, req: Req) -> torch.Tensor:
        if req.req_pool_idx is None:
            return torch.empty(0, dtype=torch.int64)
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, req.prefix_len : req.kv_len].to("cpu")

    # ---- integrity ----------------------------------------------------------------
    def check_integrity(self, live: list[Req], idle: bool = False) -> None:
        """Every slot owned exactly once (free list / radix tree / live request); when idle,
        no request rows in use and no radix locks held. Hybrid pool: also every sliding-window slot,
        and each live request's window intact."""
        self.allocator.check_integrity()
        self.req_to_token_pool.check_integrity()
        owners: dict[str, list[torch.Tensor]] = {"free list": [self.allocator.free_slots]}
        owners.update(self.prefix.owners())
        for r in live:
            owners[f"request {r.rid}"] = [self.owned_slots(r)]
        check_slot_ownership(self.capacity, owners)
        self.pool.check(live)
        if idle:
            if self.req_to_token_pool.available_size() != self.req_to_token_pool.size:
                raise AssertionError("engine idle but some req_to_token rows are still allocated (leaked request)")
            self.prefix.check_idle()
