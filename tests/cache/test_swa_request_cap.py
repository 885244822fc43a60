"""The hybrid pool's request cap (SGLang's SWARequestCapPoolConfigurator): its numbers, when it is chosen, the
budgets it gives, admission that never over-commits the sliding-window pool, and eviction that keeps every
request within its cap (no reclaiming under pressure to hide one that is not)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from impl.cache.allocator import SWATokenSlotAllocator
from impl.cache.kv_pool import ReqToTokenPool
from impl.cache.swa_request_cap import SWARequestCap, choose_swa_sizing, request_cap_budget
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import Req
from impl.sampling.sampling_params import SamplingParams

# the tiny e2b's KV shapes: 3 full layers x (32 + 32) x 4 B, 12 sliding layers x (16 + 16) x 4 B per token
FULL_B, SWA_B = 768, 1536


def _args(max_running=3, radix=False, chunk_ratio=0.8, spec=None):
    steps, draft = (spec or (None, None))
    return SimpleNamespace(max_running_requests=max_running, disable_radix_cache=not radix,
                           swa_full_tokens_ratio=chunk_ratio, speculative_algorithm="FROZEN_KV_MTP" if spec else None,
                           speculative_num_steps=steps, speculative_num_draft_tokens=draft)


def test_cap_numbers_from_a_small_config():
    cap = SWARequestCap(window=16, eviction_interval=128, draft_tokens=1, decode_alloc=1, max_running_requests=3,
                        chunked_prefill_size=16)
    assert cap.per_request == 16 + 128 + 1 + 1 == 146
    assert cap.chunk_tokens == 16 + 1 and cap.tokens == 3 * 146 + 17 == 455
    assert cap.worst_case(40) == 40 and cap.worst_case(1000) == 146
    # speculative decoding (3 steps, 4 draft tokens): the interval scales by the draft tokens, a verify allocates 4
    spec = choose_swa_sizing(_args(spec=(3, 4)), 16, 16).cap
    assert spec is not None and (spec.per_request, spec.tokens) == (16 + 128 * 4 + 1 + 4, 3 * 533 + 17)


def test_cap_is_chosen_only_with_its_preconditions(monkeypatch):
    on = choose_swa_sizing(_args(), 16, 16)
    assert on.mode == "request_cap" and on.cap is not None and on.cap.tokens == 455
    assert "--max-running-requests 3" in on.reason and "request cap" in on.describe()
    for args, chunk, why in ((_args(radix=True), 16, "the radix cache is on"),
                             (_args(max_running=None), 16, "--max-running-requests is not given"),
                             (_args(), -1, "chunked prefill is off")):
        s = choose_swa_sizing(args, 16, chunk)
        assert s.mode == "ratio" and s.cap is None and why in s.reason, s.reason
    monkeypatch.setenv("YOCO_SWA_EVICTION_INTERVAL", "8")
    assert choose_swa_sizing(_args(), 16, 16).cap.per_request == 16 + 8 + 2
    monkeypatch.setenv("YOCO_SWA_EVICTION_INTERVAL", "0")
    with pytest.raises(ValueError, match="YOCO_SWA_EVICTION_INTERVAL"):
        choose_swa_sizing(_args(), 16, 16)


def test_budgets_the_cap_gives_and_refuses():
    cap = choose_swa_sizing(_args(), 16, 16).cap
    b = request_cap_budget(1000, FULL_B, SWA_B, cap)  # the bytes of 1000 one-pool tokens
    assert (b.swa_tokens, b.full_tokens) == (455, (1000 * (FULL_B + SWA_B) - 455 * SWA_B) // FULL_B)
    b = request_cap_budget(0, FULL_B, SWA_B, cap, full_tokens=2000)  # --max-total-tokens: the full pool itself
    assert (b.full_tokens, b.swa_tokens) == (2000, 455)
    assert request_cap_budget(0, FULL_B, SWA_B, cap, full_tokens=300).swa_tokens == 300  # min(cap, N), as SGLang
    with pytest.raises(ValueError, match="leaves no room for the full-attention KV pool.*--max-running-requests"):
        request_cap_budget(300, FULL_B, SWA_B, cap)
    with pytest.raises(ValueError, match="fewer than one request's worst case"):
        request_cap_budget(0, FULL_B, SWA_B, cap, full_tokens=120)


def _req(i, prompt, new):
    return Req(f"r{i}", list(range(3, 3 + prompt)), SamplingParams(max_new_tokens=new))


def test_admission_never_over_commits_the_sliding_window_pool():
    cap = SWARequestCap(window=4, eviction_interval=8, draft_tokens=1, decode_alloc=1, max_running_requests=3,
                        chunked_prefill_size=8)
    swa = 2 * cap.per_request + 5  # room for two long requests' worst cases, not three
    kv = KVLifecycle(SWATokenSlotAllocator(200, swa + 1), ReqToTokenPool(4, 100), None, sliding_window=4,
                     swa_cap=cap, eviction_interval=8)
    long = [_req(i, 30, 40) for i in range(3)]
    assert kv.admit(long[0]) and kv.admit(long[1]) and not kv.admit(long[2])
    assert kv.admit(_req(9, 3, 2))  # a short request's worst case is its length: it fits beside them
    kv.check_integrity(list(kv.live.values()))
    kv.release(long[0])
    assert kv.admit(long[2])
    with pytest.raises(ValueError, match="request cap needs the hybrid pool without the radix cache"):
        from impl.cache.swa_radix_cache import SWARadixCache

        alloc = SWATokenSlotAllocator(20, 20)
        KVLifecycle(alloc, ReqToTokenPool(2, 10), SWARadixCache(alloc, 4), sliding_window=4, swa_cap=cap)
