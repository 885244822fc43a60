"""Prefix sharing for ``KVLifecycle``: the radix cache, or none (``--disable-radix-cache``); chosen once.

Both answer the same questions, so the request lifecycle never asks which one it has: how many cached
slots could be evicted, what prefix a request would reuse, where a finished request's slots go, and what
the integrity check must count. A request with a cache salt (``Req.cache_namespace``) keys the tree with its
token ids moved into its namespace, so it shares prefixes only with requests of the same salt.
"""

from __future__ import annotations

from typing import Protocol

import torch

from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator
from impl.cache.radix_cache import RadixCache
from impl.engine.req import Req


class PrefixCache(Protocol):
    def evictable(self) -> int: ...
    def swa_evictable(self) -> int: ...
    def match(self, req: Req) -> int: ...
    def lock(self, req: Req) -> torch.Tensor: ...
    def cache(self, req: Req, kv: torch.Tensor) -> None: ...
    def unlock(self, req: Req) -> None: ...
    def evict(self, n: int) -> None: ...
    def evict_swa(self, n: int) -> None: ...
    def owners(self) -> dict[str, list[torch.Tensor]]: ...
    def check_idle(self) -> None: ...
    def flush(self) -> None: ...


class NoPrefixCache:
    """Nothing is shared: a request starts from position 0 and its slots go back to the allocator."""

    def __init__(self, allocator: TokenSlotAllocator | SWATokenSlotAllocator):
        self.allocator = allocator

    def evictable(self) -> int:
        return 0

    def swa_evictable(self) -> int:
        return 0

    def match(self, req: Req) -> int:
        return 0

    def lock(self, req: Req) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)

    def cache(self, req: Req, kv: torch.Tensor) -> None:
        self.allocator.free(kv[req.prefix_len :])

    def unlock(self, req: Req) -> None:
        pass

    def evict(self, n: int) -> None:
        pass

    def evict_swa(self, n: int) -> None:
        pass

    def owners(self) -> dict[str, list[torch.Tensor]]:
        return {}

    def check_idle(self) -> None:
        pass

    def flush(self) -> None:
        pass


def _key(req: Req, n: int) -> list[int]:
    """The tree key of ``req``'s first ``n`` tokens: the token ids, moved into the request's cache namespace
    (``Req.cache_namespace``: a salt's tokens never equal another namespace's)."""
    ids = req.fill_ids if n >= len(req.fill_ids) else req.fill_ids[:n]  # (the whole list uncopied: match's case)
    ns = req.cache_namespace
    return ids if not ns else [t + ns for t in ids]


class RadixPrefixCache:
    """The radix tree (``RadixCache``, or ``SWARadixCache`` over the hybrid pool) owns finished prefixes; a
    request locks the prefix it reuses until it is released."""

    def __init__(self, tree: RadixCache):
        self.tree = tree

    def evictable(self) -> int:
        return self.tree.evictable_size

    def swa_evictable(self) -> int:
        return self.tree.swa_evictable_size

    def match(self, req: Req) -> int:
        return min(self.tree.match_prefix(_key(req, len(req.fill_ids))).prefix_len, req.max_prefix_len())

    def lock(self, req: Req) -> torch.Tensor:
        """The slots of the cached prefix ``req`` reuses, locked (``req.last_node``, ``req.swa_lock``)."""
        m = self.tree.match_prefix(_key(req, req.max_prefix_len()))
        req.swa_lock = self.tree.inc_lock_ref(m.last_node)
        req.last_node = m.last_node
        return m.slots

    def cache(self, req: Req, kv: torch.Tensor) -> None:
        # KV exists for fill_ids[:kv_len]; the tree keeps what it lacks, the duplicates are freed.
        self.tree.cache_request(_key(req, req.kv_len), kv, req.prefix_len, req.swa_evicted_len)
        self.unlock(req)

    def unlock(self, req: Req) -> None:
        self.tree.dec_lock_ref(req.last_node, req.swa_lock)

    def evict(self, n: int) -> None:
        self.tree.evict(n)

    def evict_swa(self, n: int) -> None:
        self.tree.evict_swa(n)

    def owners(self) -> dict[str, list[torch.Tensor]]:
        self.tree.check_integrity()
        return {"radix cache": self.tree.all_slots()}

    def check_idle(self) -> None:
        if self.tree.protected_size != 0:
            raise AssertionError(f"engine idle but {self.tree.protected_size} cached tokens are still locked")
        if self.tree.swa_protected_size != 0:
            raise AssertionError(f"engine idle but {self.tree.swa_protected_size} cached tokens keep a window lock")

    def flush(self) -> None:
        self.tree.evict_all()
        self.tree.reset()
