"""Radix prefix cache (page size 1): token-id prefixes -> KV slots, LRU eviction.

Ownership: the tree owns the slots stored in its nodes; ``evict`` returns them
to the allocator. A request that reuses a prefix locks the path to its last
matched node (``inc_lock_ref``) so the prefix cannot be evicted under it, and
unlocks it when it finishes or is retracted (``dec_lock_ref``).

Invariants (``check_integrity``): every non-root node has a non-empty key and a
value of the same length, sits in its parent under its first token, and has a
non-negative lock count no larger than its parent's (locks are taken on whole
root paths); ``evictable_size + protected_size`` is the number of cached
tokens, split by lock count zero / non-zero. ``evict(0)`` is always safe.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterator

import torch

from impl.cache.base import SlotAllocator


@dataclass(eq=False)
class TreeNode:
    key: list[int] = field(default_factory=list)  # token ids of this edge
    value: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))  # [len(key)] KV slots
    parent: "TreeNode | None" = None
    children: dict[int, "TreeNode"] = field(default_factory=dict)  # first token id -> child
    lock_ref: int = 0
    last_access: int = 0  # logical clock: LRU order is deterministic
    # hybrid sliding-window pool only (impl/cache/swa_radix_cache.py): the slots' sliding-window KV was
    # freed; requests locking the node's tokens for their window; the id ending such a lock's path
    swa_tombstone: bool = False
    swa_lock_ref: int = 0
    swa_boundary: int | None = None

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


@dataclass
class MatchResult:
    slots: torch.Tensor  # [prefix_len] int64 KV slots of the matched prefix
    last_node: TreeNode  # deepest matched node (lock it to keep the prefix)

    @property
    def prefix_len(self) -> int:
        return int(self.slots.numel())


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    # One pool: no sliding-window slots to count or evict (the hybrid pool's tree: swa_radix_cache.py).
    swa_evictable_size = 0
    swa_protected_size = 0

    def __init__(self, allocator: SlotAllocator):
        self.allocator = allocator
        self.reset()

    # ---- state ----------------------------------------------------------
    def reset(self) -> None:
        """Forget every cached prefix; the caller returns the slots first (see ``evict``)."""
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = 0
        self.evictable_size = 0
        self.protected_size = 0

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- lookup and insertion -------------------------------------------
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of ``key``; splits a node when the match ends inside it."""
        node, matched = self.root, []
        now = self._tick()
        node.last_access = now
        while key:
            child = node.children.get(key[0])
            if child is None:
                break
            n = _common_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            matched.append(child.value)
            node, key = child, key[n:]
        slots = torch.cat(matched) if matched else torch.empty(0, dtype=torch.int64)
        return MatchResult(slots, node)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Cache ``key`` -> ``value`` ([len(key)] slots). Returns how many leading tokens were
        already cached: the caller still owns ``value[:that]`` and must free the part it does
        not share with the tree; the tree now owns ``value[that:]``."""
        assert len(key) == int(value.numel()), "insert: key and value lengths differ"
        node, done = self.root, 0
        now = self._tick()
        while done < len(key):
            child = node.children.get(key[done])
            if child is None:
                new = TreeNode(key=list(key[done:]), value=value[done:].clone(), parent=node, last_access=now)
                node.children[key[done]] = new
                self.evictable_size += len(new.key)
                return done
            n = _common_len(child.key, key[done:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, done = child, done + n
        return done

    def cache_request(self, key: list[int], value: torch.Tensor, owned_from: int, swa_evicted_len: int = 0) -> None:
        """A finished (or retracted) request's ``key`` -> ``value``: the tree takes what it lacks and the
        caller's duplicate slots (positions ``owned_from ..`` the tree already had) are freed. Positions
        below ``owned_from`` are the tree's own (the request's locked prefix). ``swa_evicted_len`` matters
        to the hybrid pool's tree only."""
        done = self.insert(key, value)
        self.allocator.free(value[owned_from:done])

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(
            key=child.key[:n], value=child.value[:n].clone(), parent=parent,
            lock_ref=child.lock_ref, last_access=child.last_access,
            swa_tombstone=child.swa_tombstone, swa_lock_ref=child.swa_lock_ref, swa_boundary=child.swa_boundary,
        )
        child.swa_boundary = None  # a window lock that ended at child now ends at its upper half
        parent.children[upper.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:].clone(), upper
        upper.children[child.key[0]] = child
        return upper

    # ---- locking ----------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode | None) -> int | None:
        """Lock ``node``'s root path; returns a handle for ``dec_lock_ref`` (None here; the hybrid pool's
        tree also locks a window)."""
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent
        return None

    def dec_lock_ref(self, node: TreeNode | None, swa_lock: int | None = None) -> None:
        while node is not self.root and node is not None:
            if node.lock_ref <= 0:
                raise AssertionError("dec_lock_ref on an unlocked node (unbalanced lock/unlock)")
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    # ---- eviction ------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots of unlocked leaves, least recently used first
        (fewer if not enough are evictable). Returns the number freed."""
        if num_tokens <= 0:
            return 0
        heap = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            self.allocator.free(leaf.value)
            freed += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            parent = leaf.parent
            assert parent is not None  # a leaf is never the root
            del parent.children[leaf.key[0]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def evict_swa(self, num_tokens: int) -> int:
        """Sliding-window slots freed (none: one pool)."""
        return 0

    def evict_all(self) -> int:
        return self.evict(self.evictable_size)

    # ---- inspection -------------------------------------------------------------
    def _nodes(self) -> Iterator[TreeNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def all_slots(self) -> list[torch.Tensor]:
        return [n.value for n in self._nodes()]

    def cached_sequences(self) -> dict[tuple[int, ...], list[int]]:
        """Every root-to-leaf token sequence -> its slots (for tests and debugging)."""
        out: dict[tuple[int, ...], list[int]] = {}
        stack: list[tuple[TreeNode, list[int], list[int]]] = [(c, [], []) for c in self.root.children.values()]
        while stack:
            node, keys, vals = stack.pop()
            keys, vals = keys + node.key, vals + node.value.tolist()
            if not node.children:
                out[tuple(keys)] = vals
            stack.extend((c, keys, vals) for c in node.children.values())
        return out

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            if not node.key or len(node.key) != int(node.value.numel()):
                raise AssertionError("radix node with an empty key or a value of another length")
            if node.parent is None or node.parent.children.get(node.key[0]) is not node:
                raise AssertionError("radix node not reachable from its parent under its first token")
            if node.lock_ref < 0:
                raise AssertionError("radix node with a negative lock count")
            if node.parent is not self.root and node.lock_ref > node.parent.lock_ref:
                raise AssertionError("radix node locked more often than its parent (lock taken off a root path)")
            if node.lock_ref == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise AssertionError(
                f"radix size counters drifted: counted evictable={evictable} protected={protected}, "
                f"recorded {self.evictable_size}/{self.protected_size}"
            )
