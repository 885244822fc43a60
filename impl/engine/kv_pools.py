"""The KV pool's side of ``KVLifecycle``: one pool, or the hybrid sliding-window pool; chosen once.

Each answers the budget questions (slots obtainable now, whether a chunk and the reserves fit, the largest
chunk), allocates (evicting cached prefixes when short), and keeps its own invariants. Only the hybrid pool
has a window to track (below); for one pool every position is always in reach.

The hybrid sliding-window pool (``impl/cache/swa_pool.py``) gives every slot a sliding-window half. A
request's own tokens that left the window of every query still to come (positions below ``window_start``:
a query at position ``p`` sees ``p - W + 1 .. p``) can give that half back. When they do depends on the
radix cache, as in SGLang (``maybe_evict_swa``):

* radix cache on: when the sliding-window pool runs short (``alloc`` reclaims them before evicting cached
  prefixes), and until then they count as available, like evictable prefixes. So with room to spare a
  finished prompt is cached whole (a repeated prompt is a full hit, as in SGLang, whose radix tree holds the
  prompt's sliding-window KV as an evictable cache); under pressure each request keeps only its window.
* radix cache off (nothing is shared): as scheduling of each forward begins (``new_batch``), a request being
  prefilled frees everything below its window, a decoding one once ``eviction_interval`` tokens
  (``YOCO_SWA_EVICTION_INTERVAL``, SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``) have left it. A request then
  holds at most ``window + eviction_interval - 1`` sliding-window slots before a forward allocates. The
  request cap (``impl/cache/swa_request_cap.py``) sizes the sliding-window pool for exactly that, and admits
  a request only when the worst cases of all admitted requests fit (``admits``; a prefill chunk takes what
  is free); nothing is reclaimed under pressure there (it would hide a request over its cap).

``swa_evicted_len``: the request's tokens at positions ``prefix_len .. swa_evicted_len - 1`` gave theirs
back; the integrity check verifies every live request's window still has its sliding-window slots.
"""

from __future__ import annotations

import math
from typing import Iterable, Protocol, Sequence

import torch

from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator
from impl.cache.swa_request_cap import SWARequestCap
from impl.engine.kv_prefix import PrefixCache
from impl.engine.req import Req


def reserve(tokens: Iterable[int], ratio: float) -> int:
    """KV slots kept back for future decode tokens (SGLang's new_token_ratio share of them)."""
    return math.ceil(sum(tokens) * ratio)


class KVPool(Protocol):
    hybrid: bool
    window: int

    def full_available(self) -> int: ...
    def swa_available(self) -> int: ...
    def available(self) -> int: ...
    def fits(self, n: int, future: Sequence[int], ratio: float) -> bool: ...
    def max_chunk(self, n: int) -> int: ...
    def admits(self, req: Req) -> bool: ...
    def alloc(self, n: int) -> torch.Tensor | None: ...
    def window_start(self, req: Req) -> int: ...
    def new_batch(self) -> None: ...
    def check(self, live: list[Req]) -> None: ...


class OnePool:
    """Every layer's K/V of a token in one slot."""

    hybrid = False
    window = 0

    def __init__(self, allocator: TokenSlotAllocator, prefix: PrefixCache):
        self.allocator = allocator
        self.prefix = prefix

    def full_available(self) -> int:
        """Slots obtainable now: free plus evictable cached prefixes."""
        return self.allocator.available_size() + self.prefix.evictable()

    def swa_available(self) -> int:
        return self.full_available()

    def available(self) -> int:
        return self.full_available()

    def fits(self, n: int, future: Sequence[int], ratio: float) -> bool:
        return self.full_available() >= n + reserve(future, ratio)

    def max_chunk(self, n: int) -> int:
        return n

    def admits(self, req: Req) -> bool:
        return True

    def alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is None:
            self.prefix.evict(n - self.allocator.available_size())
            slots = self.allocator.alloc(n)
        return slots

    def window_start(self, req: Req) -> int:
        return 0  # full attention: every position stays in reach

    def new_batch(self) -> None:
        pass

    def check(self, live: list[Req]) -> None:
        pass


class HybridSWAPool:
    """Full-attention and sliding-window slots, paired per token (``SWATokenSlotAllocator``)."""

    hybrid = True

    def __init__(self, allocator: SWATokenSlotAllocator, prefix: PrefixCache, req_to_token_pool,
                 live: dict[int, Req], window: int, shares_prefixes: bool, swa_cap: SWARequestCap | None,
                 eviction_interval: int):
        if not window:
            raise ValueError("the hybrid sliding-window pool needs the model's sliding window")
        if swa_cap is not None and shares_prefixes:
            raise ValueError("the sliding-window request cap needs the hybrid pool without the radix cache")
        self.allocator = allocator
        self.prefix = prefix
        self.req_to_token_pool = req_to_token_pool
        self.live = live  # KVLifecycle's admitted requests by row (their reclaimable windows)
        self.window = window
        self.swa_cap = swa_cap
        self.eviction_interval = eviction_interval
        # without prefix sharing, out-of-window tokens are freed as requests go (maybe_evict_swa)
        self.evicts_eagerly = not shares_prefixes
        # the ratio's pool reclaims out-of-window tokens under pressure; the request cap's never needs to
        self.reclaims_lazily = swa_cap is None

    # ---- budgets -----------------------------------------------------------
    def full_available(self) -> int:
        return self.allocator.full_available_size() + self.prefix.evictable()

    def swa_available(self) -> int:
        """Sliding-window slots obtainable now: free, held by out-of-window tokens of live requests, or
        evictable from cached prefixes."""
        reclaimable = sum(self._reclaimable(r) for r in self.live.values()) if self.reclaims_lazily else 0
        return self.allocator.swa_available_size() + reclaimable + self.prefix.swa_evictable()

    def available(self) -> int:
        """Tokens allocatable now (each takes a slot of both pools)."""
        return min(self.full_available(), self.swa_available())

    def fits(self, n: int, future: Sequence[int], ratio: float) -> bool:
        """Under pressure a decoding request holds its window and one new token, so its future tokens need no
        more sliding-window slots than the window. Under the request cap the sliding-window reserve is the
        admitted requests' worst cases (``admits``), not an estimate."""
        swa_reserve = 0 if self.swa_cap is not None else reserve((min(t, self.window) for t in future), ratio)
        return self.full_available() >= n + reserve(future, ratio) and self.swa_available() >= n + swa_reserve

    def max_chunk(self, n: int) -> int:
        """A prefill chunk is at most as large as the sliding-window pool holds."""
        return min(n, self.swa_available())

    def alloc(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(n)
        if slots is not None:
            return slots
        if self.reclaims_lazily and n > self.allocator.swa_available_size():
            # live requests' out-of-window tokens first (nothing will read them), then cached prefixes
            for req in self.live.values():
                self.release_out_of_window(req)
        self.prefix.evict(n - self.allocator.full_available_size())
        self.prefix.evict_swa(n - self.allocator.swa_available_size())
        return self.allocator.alloc(n)

    # ---- the request cap (impl/cache/swa_request_cap.py) ------------------------------
    def _worst_case(self, req: Req) -> int:
        assert self.swa_cap is not None
        return self.swa_cap.worst_case(len(req.origin_input_ids) + req.sampling_params.max_new_tokens)

    def committed(self) -> int:
        """Sliding-window slots the admitted requests may hold at once after the frees of a step and its decode
        allocation: their worst cases (request cap only). A prefill chunk takes what is free beyond them (the
        scheduler bounds it by ``swa_available``), and the next step frees its tokens below the window."""
        return sum(self._worst_case(r) for r in self.live.values())

    def admits(self, req: Req) -> bool:
        """Request cap: ``req`` is admitted only when its worst case fits beside the admitted requests' (the
        sliding-window pool is never over-committed). Always True without the cap."""
        if self.swa_cap is None:
            return True
        return self.committed() + self._worst_case(req) <= self.allocator.swa_capacity - 1

    # ---- the window --------------------------------------------------------------
    def window_start(self, req: Req) -> int:
        """The lowest position a query of this request may still read in sliding layers. A query at ``p``
        sees ``p - W + 1 .. p``. The forward being built queries from ``swa_query_from`` (``kv_len`` when
        scheduling began, ``new_batch``); later ones come later, except a drafter's, at the last computed
        position ``kv_len - 1`` (a request admitted just now has none: its next query is at ``kv_len``)."""
        last = req.kv_len - 1 if req.kv_len > req.prefix_len else req.kv_len
        return max(0, min(req.swa_query_from, last) - self.window + 1)

    def new_batch(self) -> None:
        """Without the radix cache, out-of-window tokens are freed as scheduling starts (``maybe_evict_swa``)."""
        if self.evicts_eagerly:
            for req in self.live.values():
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

    def release_out_of_window(self, req: Req) -> None:
        """Give back the sliding-window slots of the request's own tokens that no later query sees:
        positions below ``window_start``."""
        if req.req_pool_idx is None:
            return
        lo = max(req.swa_evicted_len, req.prefix_len)
        hi = self.window_start(req)
        if hi <= lo:
            return
        self.allocator.free_swa(self.req_to_token_pool.req_to_token[req.req_pool_idx, lo:hi].to("cpu", torch.int64))
        req.swa_evicted_len = hi

    # ---- integrity ----------------------------------------------------------------
    def check(self, live: list[Req]) -> None:
        """Each live request's window intact; under the request cap, the admitted worst cases within the pool."""
        for r in live:
            self._check_window(r)
        if self.swa_cap is not None and self.committed() > self.allocator.swa_capacity - 1:
            raise AssertionError(f"the request cap admitted {len(self.live)} requests whose worst cases "
                                 f"({self.committed()} sliding-window slots) exceed the sliding-window pool "
                                 f"({self.allocator.swa_capacity - 1})")

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
