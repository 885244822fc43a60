"""The radix prefix cache over the hybrid sliding-window pool (SGLang's SWARadixCache design, this engine's code).

A node's tokens have full-attention slots (``value``) and, unless the node is a *tombstone*, each
slot's paired sliding-window slot (the allocator's ``full_to_swa``). A tombstone's sliding-window KV
was freed: by its request while it ran (tokens that left the window are inserted as tombstones), or
by ``evict_swa`` when the sliding-window pool ran short. Its full KV stays and full layers still read it.

Matching (``match_prefix``): a cached prefix of length ``m`` is usable only if the tokens a query at
position ``m`` sees in sliding layers, positions ``m - W + 1 .. m - 1``, still have their
sliding-window KV; the match is the longest such ``m`` (node ends, or where the key ends).

Locks: ``inc_lock_ref`` locks the root path for full layers (as the base tree) and, for the window,
the nodes holding the prefix's last ``W - 1`` tokens (``swa_lock_ref``); a window lock ends at the node
whose ``swa_boundary`` is the returned id (a split moves the id to the upper half, which also copies
the counts, so unlocking walks exactly the nodes that were locked). Invariants (``check_integrity``, on
top of the base tree's): ``swa_lock_ref <= lock_ref``, no tombstone is window-locked, a tombstone's
slots pair with no sliding-window slot and a live node's all do, and the window counters
(``swa_evictable_size`` / ``swa_protected_size``: live tokens without / with a window lock) are exact.

Eviction: ``evict`` (full slots) frees unlocked leaves, tombstones first (they can end no match);
``evict_swa`` frees sliding-window KV of live nodes without a window lock, least recently used
first (a parent before its children): an unlocked leaf goes entirely, any other node becomes a
tombstone.
"""

from __future__ import annotations

import heapq
import itertools

import torch

from impl.cache.allocator import SWATokenSlotAllocator
from impl.cache.radix_cache import MatchResult, RadixCache, TreeNode, _common_len


class SWARadixCache(RadixCache):
    def __init__(self, allocator: SWATokenSlotAllocator, sliding_window: int):
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        self.window = int(sliding_window)
        self._ids = itertools.count(1)
        super().__init__(allocator)
        self.allocator: SWATokenSlotAllocator = allocator

    def reset(self) -> None:
        super().reset()
        self.swa_evictable_size = 0
        self.swa_protected_size = 0

    # ---- lookup and insertion -------------------------------------------
    def _valid(self, m: int, run: int) -> bool:
        """A prefix of length ``m`` whose last ``run`` tokens have sliding-window KV is usable."""
        return run >= min(m, self.window - 1)

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of ``key`` whose window tokens still have sliding-window KV."""
        now = self._tick()
        self.root.last_access = now
        path: list[tuple[TreeNode, int]] = []  # (node, tokens of it matched)
        node = self.root
        while key:
            child = node.children.get(key[0])
            if child is None:
                break
            n = _common_len(child.key, key)
            path.append((child, n))
            if n < len(child.key):
                break
            node, key = child, key[n:]
        best, total, run = -1, 0, 0
        for i, (child, n) in enumerate(path):
            total += n
            run = 0 if child.swa_tombstone else run + n
            if self._valid(total, run):
                best = i
        if best < 0:
            return MatchResult(torch.empty(0, dtype=torch.int64), self.root)
        values = []
        last = self.root
        for child, n in path[: best + 1]:
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            values.append(child.value)
            last = child
        return MatchResult(torch.cat(values), last)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        raise NotImplementedError("the hybrid pool's tree takes whole requests: use cache_request")

    def cache_request(self, key: list[int], value: torch.Tensor, owned_from: int, swa_evicted_len: int = 0) -> None:
        """Insert ``key`` -> ``value``; positions below ``swa_evicted_len`` have no sliding-window KV (the
        request freed it). The caller's slots from ``owned_from`` the tree already holds are freed, except
        where they revive an unlocked tombstone: the tree then takes them (they carry sliding-window KV)
        and frees the tombstone's own."""
        assert len(key) == int(value.numel()), "cache_request: key and value lengths differ"
        node, pos = self.root, 0
        now = self._tick()
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_len(child.key, key[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            lo = max(pos, owned_from)
            if lo < pos + n:
                if child.swa_tombstone and child.lock_ref == 0 and lo == pos and swa_evicted_len <= pos:
                    self.allocator.free(child.value)  # the tombstone's full slots (no sliding-window half left)
                    child.value = value[pos : pos + n].clone()
                    child.swa_tombstone = False
                    self.swa_evictable_size += n
                else:
                    self.allocator.free(value[lo : pos + n])
            node, pos = child, pos + n
        if pos < len(key):
            assert pos >= owned_from, "a request's locked prefix is missing from the tree"
            cut = min(max(swa_evicted_len, pos), len(key))
            if cut > pos:
                node = self._add(node, key[pos:cut], value[pos:cut], tombstone=True, now=now)
            if cut < len(key):
                self._add(node, key[cut:], value[cut:], tombstone=False, now=now)

    def _add(self, parent: TreeNode, key: list[int], value: torch.Tensor, tombstone: bool, now: int) -> TreeNode:
        new = TreeNode(key=list(key), value=value.clone(), parent=parent, last_access=now, swa_tombstone=tombstone)
        parent.children[key[0]] = new
        self.evictable_size += len(key)
        if not tombstone:
            self.swa_evictable_size += len(key)
        return new

    # ---- locking ----------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode | None) -> int | None:
        """Lock ``node``'s root path (full layers) and the nodes of its last ``W - 1`` tokens (the window);
        returns the window lock's id for ``dec_lock_ref``."""
        super().inc_lock_ref(node)
        covered, top = 0, None
        while node is not self.root and node is not None and covered < self.window - 1:
            assert not node.swa_tombstone, "window-locking a tombstone (the match should have stopped before it)"
            if node.swa_lock_ref == 0:
                self.swa_evictable_size -= len(node.key)
                self.swa_protected_size += len(node.key)
            node.swa_lock_ref += 1
            covered += len(node.key)
            top, node = node, node.parent
        if top is None:
            return None
        if top.swa_boundary is None:
            top.swa_boundary = next(self._ids)
        return top.swa_boundary

    def dec_lock_ref(self, node: TreeNode | None, swa_lock: int | None = None) -> None:
        if swa_lock is not None:
            x = node
            while True:
                if x is self.root or x is None or x.swa_lock_ref <= 0:
                    raise AssertionError("dec_lock_ref: the window lock's path is broken (unbalanced lock/unlock)")
                if x.swa_lock_ref == 1:
                    self.swa_protected_size -= len(x.key)
                    self.swa_evictable_size += len(x.key)
                x.swa_lock_ref -= 1
                if x.swa_boundary == swa_lock:
                    break
                x = x.parent
        super().dec_lock_ref(node)

    # ---- eviction ------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free the full (and any sliding-window) slots of at least ``num_tokens`` tokens of unlocked leaves:
        tombstones first, then least recently used."""
        if num_tokens <= 0:
            return 0
        heap = [(not n.swa_tombstone, n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)[3]
            freed += self._drop_leaf(leaf)
            parent = leaf.parent
            assert parent is not None  # a leaf is never the root
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (not parent.swa_tombstone, parent.last_access, id(parent), parent))
        return freed

    def _drop_leaf(self, leaf: TreeNode) -> int:
        self.allocator.free(leaf.value)
        self.evictable_size -= len(leaf.key)
        if not leaf.swa_tombstone:
            self.swa_evictable_size -= len(leaf.key)
        assert leaf.parent is not None  # a leaf is never the root
        del leaf.parent.children[leaf.key[0]]
        return len(leaf.key)

    def evict_swa(self, num_tokens: int) -> int:
        """Free the sliding-window slots of at least ``num_tokens`` cached tokens without a window lock,
        least recently used first (an unlocked leaf goes entirely, other nodes become tombstones)."""
        if num_tokens <= 0:
            return 0
        # a match touches a whole path at once: among equal times the shallower node counts as older (its
        # tokens are further from where any reuse's window is)
        heap = [(n.last_access, depth, id(n), n) for n, depth in self._nodes_with_depth()
                if not n.swa_tombstone and n.swa_lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[3]
            if node.parent is None or node.swa_tombstone or node.swa_lock_ref:  # gone or changed since pushed
                continue
            if not node.children and node.lock_ref == 0:
                parent = node.parent
                freed += self._drop_leaf(node)
                node.parent = None
                if parent is not self.root and not parent.children and parent.lock_ref == 0 and parent.swa_tombstone:
                    self._drop_leaf(parent)  # a tombstone leaf can end no match
                    parent.parent = None
                continue
            self.allocator.free_swa(node.value)
            node.swa_tombstone = True
            self.swa_evictable_size -= len(node.key)
            freed += len(node.key)
        return freed

    def _nodes_with_depth(self):
        stack = [(c, 1) for c in self.root.children.values()]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in node.children.values())

    # ---- inspection -------------------------------------------------------------
    def check_integrity(self) -> None:
        super().check_integrity()
        evictable = protected = 0
        pairs = self.allocator.full_to_swa.cpu()
        for node in self._nodes():
            if node.swa_lock_ref < 0 or node.swa_lock_ref > node.lock_ref:
                raise AssertionError("radix node with a window lock count outside 0..its lock count")
            mapped = pairs[node.value] > 0
            if node.swa_tombstone:
                if node.swa_lock_ref:
                    raise AssertionError("a tombstone (no sliding-window KV) is window-locked")
                if bool(mapped.any()):
                    raise AssertionError("a tombstone's slot still pairs with a sliding-window slot")
                continue
            if not bool(mapped.all()):
                raise AssertionError("a cached token without a tombstone lost its sliding-window slot")
            if node.swa_lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        if (evictable, protected) != (self.swa_evictable_size, self.swa_protected_size):
            raise AssertionError(
                f"radix window counters drifted: counted evictable={evictable} protected={protected}, recorded "
                f"{self.swa_evictable_size}/{self.swa_protected_size}"
            )
