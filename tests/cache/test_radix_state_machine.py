"""Allocator + radix cache against a plain model (a dict prefix -> slot), invariants after every step."""

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from impl.cache.allocator import TokenSlotAllocator, check_slot_ownership
from impl.cache.radix_cache import RadixCache

CAP = 24
keys = st.lists(st.integers(0, 3), min_size=1, max_size=6)


class RadixMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = TokenSlotAllocator(CAP)
        self.tree = RadixCache(self.alloc)
        self.model: dict[tuple[int, ...], int] = {}  # every cached prefix -> slot of its last token
        self.locks: list[tuple[object, tuple[int, ...]]] = []
        self.live: list[torch.Tensor] = []  # slots owned by "requests"

    def _model_match(self, key):
        out = []
        for i in range(len(key)):
            s = self.model.get(tuple(key[: i + 1]))
            if s is None:
                break
            out.append(s)
        return out

    def _locked_prefixes(self):
        return {p[:i] for _, p in self.locks for i in range(1, len(p) + 1)}

    @rule(key=keys)
    def insert(self, key):
        slots = self.alloc.alloc(len(key))
        if slots is None:
            self.evict(len(key))
            slots = self.alloc.alloc(len(key))
            if slots is None:
                return
        done = self.tree.insert(key, slots)
        assert done == len(self._model_match(key))
        self.alloc.free(slots[:done])
        for i in range(done, len(key)):
            self.model[tuple(key[: i + 1])] = int(slots[i])

    @rule(key=keys)
    def match(self, key):
        assert self.tree.match_prefix(key).slots.tolist() == self._model_match(key)

    @rule(key=keys)
    def lock(self, key):
        m = self.tree.match_prefix(key)
        if m.prefix_len:
            self.tree.inc_lock_ref(m.last_node)
            self.locks.append((m.last_node, tuple(key[: m.prefix_len])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        node, _ = self.locks.pop(i % len(self.locks))
        self.tree.dec_lock_ref(node)

    @rule(n=st.integers(0, CAP))
    def evict(self, n):
        before, evictable = dict(self.model), self.tree.evictable_size
        freed = self.tree.evict(n)
        assert freed >= min(n, evictable) or freed == evictable
        remaining = {k: v for k, v in before.items() if self._tree_has(k)}
        gone = set(before) - set(remaining)
        assert len(gone) == freed
        assert not gone & self._locked_prefixes(), "a locked prefix was evicted"
        assert all(k[:-1] not in gone for k in remaining), "evicted a prefix but kept its extension"
        self.model = remaining

    def _tree_has(self, key):
        return self.tree.match_prefix(list(key)).slots.tolist() == [self.model_or_none(key[: i + 1]) for i in range(len(key))]

    def model_or_none(self, k):
        return self.model.get(k)

    @rule(n=st.integers(1, 5))
    def request_alloc(self, n):
        s = self.alloc.alloc(n)
        if s is not None:
            self.live.append(s)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def request_free(self, i):
        self.alloc.free(self.live.pop(i % len(self.live)))

    @invariant()
    def ownership(self):
        self.tree.check_integrity()
        self.alloc.check_integrity()
        check_slot_ownership(CAP, {"free": [self.alloc.free_slots], "tree": self.tree.all_slots(), "live": self.live})
        assert self.tree.total_size == len(self.model)
        assert self.tree.protected_size == len(self._locked_prefixes())


RadixMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestRadixMachine = RadixMachine.TestCase
