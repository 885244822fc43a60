"""KVLifecycle over the hybrid pool (paired allocator + tombstone radix tree) against a shadow of what each
slot holds: random admissions, prefill chunks, decode steps (one request's, or every request's at once),
speculative rows rejected, releases and flushes under a tight sliding-window budget. After every step every slot
is owned once in both pools, and every live request reads the right token at each position a query of it may
still see (full layers: all positions; sliding layers: its window), so no slot inside a window was freed or
reused."""

from __future__ import annotations

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from impl.cache.allocator import SWATokenSlotAllocator
from impl.cache.kv_pool import ReqToTokenPool
from impl.cache.swa_radix_cache import SWARadixCache
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import Req
from impl.sampling.sampling_params import SamplingParams

FULL, SWA, W, ROWS, CTX = 48, 11, 4, 3, 40
# prompts share prefixes often (two symbols, a common start)
prompts = st.builds(lambda head, tail: [0] * head + tail, st.integers(0, 6), st.lists(st.integers(0, 1), max_size=8))


class HybridKVMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = SWATokenSlotAllocator(FULL, SWA)
        self.tree = SWARadixCache(self.alloc, W)
        self.kv = KVLifecycle(self.alloc, ReqToTokenPool(ROWS, CTX), self.tree, sliding_window=W)
        self.full_tok = torch.full((FULL,), -1)  # token each full slot holds
        self.swa_tok = torch.full((SWA,), -1)  # token each sliding-window slot holds
        self.live: list[Req] = []
        self.n = 0

    def _row(self, r: Req) -> torch.Tensor:
        return self.kv.req_to_token_pool.req_to_token[r.req_pool_idx]

    def _write(self, r: Req, start: int, slots: torch.Tensor) -> None:
        toks = torch.tensor(r.fill_ids[start : start + slots.numel()])
        self.full_tok[slots] = toks
        self.swa_tok[self.alloc.full_to_swa[slots]] = toks

    @rule(p=prompts)
    def admit(self, p):
        if not p:
            return
        self.n += 1
        r = Req(f"r{self.n}", list(p), SamplingParams(max_new_tokens=20))
        if self.kv.admit(r):
            self.live.append(r)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 10), n=st.integers(1, 6), rejected=st.integers(0, 2), steps=st.integers(1, 6))
    def extend(self, i, n, rejected, steps):
        """A prefill chunk of up to n tokens, or decode steps (each a new token, plus rejected draft rows)."""
        r = self.live[i % len(self.live)]
        for _ in range(steps if r.kv_len == r.seq_len else 1):
            self._extend(r, n, rejected)

    def _extend(self, r: Req, n: int, rejected: int) -> None:
        if r.kv_len == r.seq_len:  # caught up: decode one new token
            if r.seq_len >= CTX - 3:
                return
            r.append_output(r.seq_len % 3)
            n, extra = 1, rejected
        else:
            n, extra = min(n, r.seq_len - r.kv_len), 0
        start = r.kv_len
        slots = self.kv.extend(r, n + extra)
        if slots is None:
            return
        self._write(r, start, slots[:n])
        if extra:  # speculative rows beyond the token: written, then rejected
            self.kv.trim(r, start + n)

    @precondition(lambda self: self.live)
    @rule()
    def decode_step(self):
        """A decode step of every caught-up request at once (the scheduler's ``extend_each``); when the pools are
        short nothing is taken, and the new tokens wait for a later extend."""
        reqs = [r for r in self.live if r.kv_len == r.seq_len and r.seq_len < CTX - 3]
        for r in reqs:
            r.append_output(r.seq_len % 3)
        starts = [r.kv_len for r in reqs]
        slots = self.kv.extend_each(reqs)
        if slots is None:
            return
        assert [r.kv_len for r in reqs] == [s + 1 for s in starts]
        for r, start, slot in zip(reqs, starts, slots):
            self._write(r, start, slot)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 10))
    def release(self, i):
        self.kv.release(self.live.pop(i % len(self.live)))

    @rule()
    def flush(self):
        if not self.live:
            self.tree.evict_all()
            self.tree.reset()

    @rule()
    def new_batch(self):
        """The scheduler starts building a batch: the previous forward is done."""
        self.kv.new_batch()

    @rule(n=st.integers(1, SWA))
    def pressure(self, n):
        """An allocation elsewhere that needs n slots of each pool (reclaims windows, evicts the tree)."""
        got = self.kv.alloc(n)
        if got is not None:
            self.alloc.free(got)

    @invariant()
    def every_slot_owned_once_and_every_window_intact(self):
        self.kv.check_integrity(self.live, idle=not self.live)
        for r in self.live:
            row = self._row(r)[: r.kv_len]
            want = torch.tensor(r.fill_ids[: r.kv_len])
            assert torch.equal(self.full_tok[row], want), f"{r.rid}: a full slot was reused under it"
            lo = self.kv.window_start(r)
            swa = self.alloc.full_to_swa[row[lo:]]
            assert torch.equal(self.swa_tok[swa], want[lo:]), f"{r.rid}: its window reads another token"


HybridKVMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestHybridKVMachine = HybridKVMachine.TestCase
