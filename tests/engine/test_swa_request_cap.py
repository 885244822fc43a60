"""The request cap under the scheduler (model-free runner): out-of-window tokens are freed as requests go, as
SGLang does (each prefill chunk; decoding, every eviction interval), so no request ever holds more
sliding-window slots than its cap, the pool sized by the cap never runs short (no preemption), and the
tokens are those of greedy decoding from the context."""

from __future__ import annotations

import torch
from tests.helpers.fake_runner import VOCAB, FakeRunner, context_logits, make_req

from impl.cache.allocator import SWATokenSlotAllocator
from impl.cache.swa_request_cap import SWARequestCap
from impl.engine.intake import IntakePolicy, validate_req
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.kv_pools import HybridSWAPool
from impl.engine.scheduler import Scheduler
from impl.engine.scheduler_config import SchedulerConfig

W, INTERVAL, RUNNING, CHUNK, MAX_LEN = 4, 8, 3, 6, 128
PROMPTS = [[2 + (7 * i + i * i) % 13 for i in range(n)] for n in (5, 23, 11, 30, 2)]


def _scheduler() -> tuple[Scheduler, SWARequestCap]:
    cap = SWARequestCap(window=W, eviction_interval=INTERVAL, draft_tokens=1, decode_alloc=1,
                        max_running_requests=RUNNING, chunked_prefill_size=CHUNK)
    runner = FakeRunner(2001, RUNNING, MAX_LEN)  # a full-attention pool to spare: only the cap limits
    kv = KVLifecycle(SWATokenSlotAllocator(2001, cap.tokens + 1), runner.req_to_token_pool, None, sliding_window=W,
                     swa_cap=cap, eviction_interval=INTERVAL)
    cfg = SchedulerConfig(max_running_requests=RUNNING, chunked_prefill_size=CHUNK, max_prefill_tokens=4096,
                          max_req_len=MAX_LEN, eos_token_ids=(1,), vocab_size=VOCAB)
    return Scheduler(cfg, runner, kv), cap


def _greedy(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(context_logits(ids).argmax()))
    return ids[len(prompt):]


def _drive(sched: Scheduler, new_tokens: int, steps: int = 5000) -> tuple[list, int]:
    """Run PROMPTS (at most ``steps`` steps); after every forward check integrity and record the most
    sliding-window slots one request held."""
    reqs = [make_req(f"r{i}", p, max_new_tokens=new_tokens, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    for r in reqs:
        validate_req(r, IntakePolicy(MAX_LEN, VOCAB))
        sched.add_request(r)
    kv, peak = sched.kv, 0
    for _ in range(steps):
        if not sched.has_work:
            break
        sched.step()
        pairs = kv.allocator.full_to_swa
        for r in sched.live_reqs:
            row = kv.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_len]
            peak = max(peak, int((pairs[row] != 0).sum()))
        sched.check_integrity()
    return reqs, peak


def test_eviction_keeps_every_request_within_its_cap_and_the_pool_never_short():
    sched, cap = _scheduler()
    reqs, peak = _drive(sched, new_tokens=60)
    assert not sched.has_work and [r.output_ids for r in reqs] == [_greedy(p, 60) for p in PROMPTS]
    assert sched.num_retractions == 0  # the cap's pool held every admitted request's worst case
    # a decoding request frees every INTERVAL tokens, not every step: it holds up to window + interval (+ its new
    # token), within the cap, and far below its 60+ tokens
    assert W + INTERVAL - 1 <= peak <= cap.per_request
    kv = sched.kv
    assert kv.allocator.swa_available_size() == cap.tokens and kv.allocator.full_available_size() == 2000


def test_without_eviction_requests_outgrow_the_cap(monkeypatch):
    """The check above can fail: without the frees as requests go (nothing reclaims under the cap), requests hold
    their whole context, beyond the cap, and the pool the cap sized runs short: requests are preempted (a
    request longer than the pool is preempted over and over)."""
    monkeypatch.setattr(HybridSWAPool, "maybe_evict_swa", lambda self, req: None)
    sched, cap = _scheduler()
    _, peak = _drive(sched, new_tokens=60, steps=300)
    assert peak > cap.per_request and sched.num_retractions > 0


def test_the_ratio_pool_without_radix_frees_as_it_goes_too():
    """The ratio's pool without the radix cache evicts on the same schedule (SGLang's no-prefix-sharing path)."""
    runner = FakeRunner(2001, RUNNING, MAX_LEN)
    kv = KVLifecycle(SWATokenSlotAllocator(2001, 1601), runner.req_to_token_pool, None, sliding_window=W,
                     eviction_interval=INTERVAL)
    cfg = SchedulerConfig(max_running_requests=RUNNING, chunked_prefill_size=CHUNK, max_prefill_tokens=4096,
                          max_req_len=MAX_LEN, eos_token_ids=(1,), vocab_size=VOCAB)
    sched = Scheduler(cfg, runner, kv)
    reqs, peak = _drive(sched, new_tokens=40)
    assert not sched.has_work and peak <= W + INTERVAL + 1 and [r.output_ids for r in reqs] == [_greedy(p, 40) for p in PROMPTS]
    assert torch.equal(torch.sort(kv.allocator.swa.free_slots).values, torch.arange(1, 1601))
