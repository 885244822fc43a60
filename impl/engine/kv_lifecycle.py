"""A request's KV slots from admission to release: prefix match, growth, caching, freeing.

Ownership (see ``impl/cache/base.py``): ``req_to_token[idx, :prefix_len]`` are
radix-cache slots the request has locked; ``req_to_token[idx, prefix_len:kv_len]``
belong to the request until ``release`` hands them to the tree (radix cache on)
or back to the allocator (off).

With the hybrid sliding-window pool (``impl/cache/swa_pool.py``) every slot also has a
sliding-window half. A request's own tokens that left the window of every query still to come
(positions below ``window_start``: a query at position ``p`` sees ``p - W + 1 .. p``) can give that
half back. When they do depends on the radix cache, as in SGLang (``maybe_evict_swa``):

* radix cache on: when the sliding-window pool runs short (``alloc`` reclaims them before evicting
  cached prefixes), and until then they count as available, like evictable prefixes. So with room to
  spare a finished prompt is cached whole (a repeated prompt is a full hit, as in SGLang, whose radix
  tree holds the prompt's sliding-window KV as an evictable cache); under pressure each request keeps
  only its window.
* radix cache off (nothing is shared): as scheduling of each forward begins (``new_batch``), a request
  being prefilled frees everything below its window, a decoding one once ``eviction_interval`` tokens
  (``YOCO_SWA_EVICTION_INTERVAL``, SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``) have left it. A request
  then holds at most ``window + eviction_interval - 1`` sliding-window slots before a forward allocates.
  The request cap (``impl/cache/swa_request_cap.py``) sizes the sliding-window pool for exactly that, and
  admits a request only when the worst cases of all admitted requests fit (``swa_cap_admits``; a prefill
  chunk takes what is free); nothing is reclaimed under pressure there (it would hide a request over its cap).

``swa_evicted_len``: the request's tokens at positions ``prefix_len .. swa_evicted_len - 1`` gave theirs
back; the integrity check verifies every live request's window still has its sliding-window slots.
"""

from __future__ import annotations

import torch

from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator, check_slot_ownership
from impl.cache.radix_cache import RadixCache
from impl.cache.swa_request_cap import SWARequestCap, swa_eviction_interval
from impl.engine.req import Req


class KVLifecycle:
    def __init__(self, allocator: TokenSlotAllocator | SWATokenSlotAllocator, req_to_token_pool,
                 tree: RadixCache | None, sliding_window: int | None = None, swa_cap: SWARequestCap | None = None,
                 eviction_interval: int | None = None):
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.tree = tree
        self.hybrid = isinstance(allocator, SWATokenSlotAllocator)
        if self.hybrid and not sliding_window:
            raise ValueError("the hybrid sliding-window pool needs the model's sliding window")
        self.window = int(sliding_window or 0)
        self.live: dict[int, Req] = {}  # admitted requests by req_to_token row (their reclaimable windows)
        # hybrid pool without the radix cache: out-of-window tokens are freed as requests go (maybe_evict_swa)
        self.evicts_eagerly = self.hybrid and tree is None
        self.eviction_interval = int(eviction_interval or swa_eviction_interval())
        if swa_cap is not None and not self.evicts_eagerly:
            raise ValueError("the sliding-window request cap needs the hybrid pool without the radix cache")
        self.swa_cap = swa_cap
        # the ratio's pool reclaims out-of-window tokens under pressure; the request cap's never needs to
        self.reclaims_lazily = self.hybrid and swa_cap is None

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    # ---- budgets -----------------------------------------------------------
    def full_available(self) -> int:
        """Full-attention slots obtainable now: free plus evictable cached prefixes."""
        free = self.allocator.full_available_size() if self.hybrid else self.allocator.available_size()
        return free + (self.tree.evictable_size if self.tree else 0)

    def swa_available(self) -> int:
        """Sliding-window slots obtainable now: free, held by out-of-window tokens of live requests, or
        evictable from cached prefixes (the full count for one pool)."""
        if not self.hybrid:
            return self.full_available()
        reclaimable = sum(self._reclaimable(r) for r in self.live.values()) if self.reclaims_lazily else 0
        return self.allocator.swa_available_size() + reclaimable + (self.tree.swa_evictable_size if self.tree else 0)

    def window_start(self, req: Req) -> int:
        """The lowest position a query of this request may still read in sliding layers. A query at ``p``
        sees ``p - W + 1 .. p``. The forward being built queries from ``swa_query_from`` (``kv_len`` when
        scheduling began, ``new_batch``); later ones come later, except a drafter's, at the last computed
        position ``kv_len - 1`` (a request admitted just now has none: its next query is at ``kv_len``)."""
        last = req.kv_len - 1 if req.kv_len > req.prefix_len else req.kv_len
        return max(0, min(req.swa_query_from, last) - self.window + 1)

    def new_batch(self) -> None:
        """Scheduling starts: the previous forward is done, so every request's next query is at its kv_len;
        without the radix cache, out-of-window tokens are freed now (``maybe_evict_swa``)."""
        for req in self.live.values():
            req.swa_query_from = req.kv_len
            if self.evicts_eagerly:
                self.maybe_evict_swa(req)

    def maybe_evict_swa(self, req: Req) -> None:
        """SGLang's ``maybe_evict_swa`` without prefix sharing: a request whose next forward extends it by a
        prefill chunk frees all its out-of-window tokens; a decoding one once ``eviction_interval`` of them
        have gathered (the free is amortised; the request cap reserves the interval)."""
        prefilling = req.kv_len + 1 < req.seq_len
        if self._reclaimable(req) >= (1 if prefilling else self.eviction_interval):
            self.release_out_of_window(req)

    def _reclaimable(self, req: Req) -> int:
        return max(0, self.window_start(req) - max(req.swa_evicted_len, req.prefix_len))

    def available(self) -> int:
        """Tokens allocatable now (each takes a slot of every pool)."""
        return min(self.full_available(), self.swa_available()) if self.hybrid else self.full_available()

    def fits(self, n: int, full_reserve: int, swa_reserve: int) -> bool:
        """``n`` new tokens plus the reserves (future decode tokens) fit in every pool. Under the request cap the
        sliding-window reserve is the admitted requests' worst cases (``swa_cap_admits``), not an estimate."""
        if not self.hybrid:
            return self.full_available() >= n + full_reserve
        swa_reserve = 0 if self.swa_cap is not None else swa_reserve
        return self.full_available() >= n + full_reserve and self.swa_available() >= n + swa_reserve

    # ---- the request cap (impl/cache/swa_request_cap.py) ------------------------------
    def _swa_worst_case(self, req: Req) -> int:
        assert self.swa_cap is not None
        return self.swa_cap.worst_case(len(req.origin_input_ids) + req.sampling_params.max_new_tokens)

    def swa_committed(self) -> int:
        """Sliding-window slots the admitted requests may hold at once after the frees of a step and its decode
        allocation: their worst cases (request cap only). A prefill chunk takes what is free beyond them (the
        scheduler bounds it by ``swa_available``), and the next step frees its tokens below the window."""
        assert self.swa_cap is not None
        return sum(self._swa_worst_case(r) for r in self.live.values())

    def swa_cap_admits(self, req: Req) -> bool:
        """Request cap: ``req`` is admitted only when its worst case fits beside the admitted requests' (the
        sliding-window pool is never over-committed). Always True without the cap."""
        if self.swa_cap is None:
            return True
        return self.swa_committed() + self._swa_worst_case(req) <= self.allocator.swa_capacity - 1

    def alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is not None:
            return slots
        if self.reclaims_lazily and n > self.allocator.swa_available_size():
            # live requests' out-of-window tokens first (nothing will read them), then cached prefixes
            for req in self.live.values():
                self.release_out_of_window(req)
        if self.tree is not None:
            if self.hybrid:
                self.tree.evict(n - self.allocator.full_available_size())
                self.tree.evict_swa(n - self.allocator.swa_available_size())
            else:
                self.tree.evict(n - self.allocator.available_size())
        return self.allocator.alloc(n)

    # ---- a request's life -------------------------------------------------------
    def match(self, req: Req) -> int:
        """Length of the cached prefix ``admit`` would reuse (no state change besides LRU)."""
        if self.tree is None:
            return 0
        return min(self.tree.match_prefix(req.fill_ids).prefix_len, req.max_prefix_len())

    def admit(self, req: Req) -> bool:
        """Give ``req`` a req_to_token row and lock its cached prefix. False if no row is free, or if the
        request cap cannot take its worst case now."""
        if not self.swa_cap_admits(req):
            return False
        idx = self.req_to_token_pool.alloc()
        if idx is None:
            return False
        req.req_pool_idx = idx
        prefix = 0
        if self.tree is not None:
            m = self.tree.match_prefix(req.fill_ids[: req.max_prefix_len()])
            prefix = m.prefix_len
            req.swa_lock = self.tree.inc_lock_ref(m.last_node)
            req.last_node = m.last_node
            self.req_to_token_pool.req_to_token[idx, :prefix] = m.slots.to(self.req_to_token_pool.device)
        req.prefix_len = req.kv_len = req.swa_evicted_len = req.swa_query_from = prefix
        self.live[idx] = req
        return True

    def release_out_of_window(self, req: Req) -> None:
        """Give back the sliding-window slots of the request's own tokens that no later query sees:
        positions below ``window_start``."""
        if not self.hybrid or req.req_pool_idx is None:
            return
        lo = max(req.swa_evicted_len, req.prefix_len)
        hi = self.window_start(req)
        if hi <= lo:
            return
        self.allocator.free_swa(self.req_to_token_pool.req_to_token[req.req_pool_idx, lo:hi].to("cpu", torch.int64))
        req.swa_evicted_len = hi

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
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to("cpu", torch.int64)
        if self.tree is not None:
            # KV exists for fill_ids[:kv_len]; the tree keeps what it lacks, the duplicates are freed.
            self.tree.cache_request(req.fill_ids[: req.kv_len], kv, req.prefix_len, req.swa_evicted_len)
            self.tree.dec_lock_ref(req.last_node, req.swa_lock)
        else:
            self.allocator.free(kv[req.prefix_len :])
        self._forget(req)

    def discard(self, req: Req) -> None:
        """A failed request: free its own slots without caching them (their KV may never have been written)."""
        if req.req_pool_idx is None:
            return
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].to("cpu", torch.int64)
        self.allocator.free(kv[req.prefix_len :])
        if self.tree is not None:
            self.tree.dec_lock_ref(req.last_node, req.swa_lock)
        self._forget(req)

    def _forget(self, req: Req) -> None:
        self.live.pop(req.req_pool_idx, None)
        self.req_to_token_pool.free(req.req_pool_idx)
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
        if self.tree is not None:
            self.tree.check_integrity()
            owners["radix cache"] = self.tree.all_slots()
        for r in live:
            owners[f"request {r.rid}"] = [self.owned_slots(r)]
        check_slot_ownership(self.capacity, owners)
        if self.hybrid:
            for r in live:
                self._check_window(r)
        if self.swa_cap is not None and self.swa_committed() > self.allocator.swa_capacity - 1:
            raise AssertionError(f"the request cap admitted {len(self.live)} requests whose worst cases "
                                 f"({self.swa_committed()} sliding-window slots) exceed the sliding-window pool "
                                 f"({self.allocator.swa_capacity - 1})")
        if idle:
            if self.req_to_token_pool.available_size() != self.req_to_token_pool.size:
                raise AssertionError("engine idle but some req_to_token rows are still allocated (leaked request)")
            if self.tree is not None and self.tree.protected_size != 0:
                raise AssertionError(f"engine idle but {self.tree.protected_size} cached tokens are still locked")
            if self.tree is not None and self.tree.swa_protected_size != 0:
                raise AssertionError(f"engine idle but {self.tree.swa_protected_size} cached tokens keep a window lock")

    def _check_window(self, r: Req) -> None:
        """Positions the next query sees have sliding-window slots; the request's out-of-window ones do not."""
        if r.req_pool_idx is None:
            return
        row = self.req_to_token_pool.req_to_token[r.req_pool_idx].cpu()
        pairs = self.allocator.full_to_swa.cpu()
        lo = self.window_start(r)
        window = pairs[row[lo : r.kv_len]]
        if bool((window == 0).any()):
            p = lo + int(torch.nonzero(window == 0)[0])
            raise AssertionError(f"request {r.rid}: position {p} is inside the sliding window of its queries (from "
                                 f"position {min(r.swa_query_from, r.kv_len)}, window {self.window}) but its "
                                 "sliding-window KV was freed")
        if bool((pairs[row[r.prefix_len : r.swa_evicted_len]] != 0).any()):
            raise AssertionError(f"request {r.rid}: an out-of-window token it released still holds a sliding-window slot")
        if bool((pairs[row[r.swa_evicted_len : lo]] == 0).any()):
            raise AssertionError(f"request {r.rid}: a token past its released ones lost its sliding-window slot")
