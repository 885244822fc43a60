"""Engine greedy output equals transformers generate, whatever the schedule (batching, radix cache,
chunked prefill, preemption under a tiny KV budget); all KV slots are free afterwards."""

import pytest

from tests.helpers.engines import assert_greedy_matches, engine, prompts

MAX_NEW = 8
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}


def _check(name, eng, ps):
    outs = eng.generate(input_ids=ps, sampling_params=GREEDY)
    compared = [assert_greedy_matches(name, p, o["output_ids"], MAX_NEW) for p, o in zip(ps, outs)]
    assert sum(compared) >= len(ps) * MAX_NEW // 2, "too many near ties: the comparison is vacuous"
    eng.check_integrity()
    return outs


@pytest.mark.parametrize("name", ["e2b", "noshare"])
def test_batch_of_mixed_lengths_matches_transformers(name):
    outs = _check(name, engine(name), prompts())
    for p, o in zip(prompts(), outs):
        assert o["meta_info"]["prompt_tokens"] == len(p) and o["meta_info"]["completion_tokens"] == MAX_NEW
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_NEW}


@pytest.mark.parametrize(
    "kw",
    [
        dict(chunked_prefill_size=4),
        dict(disable_radix_cache=True),
        dict(max_total_tokens=60, chunked_prefill_size=16, disable_hybrid_swa_memory=True),
        dict(max_total_tokens=60, chunked_prefill_size=16, swa_full_tokens_ratio=1.0),
        dict(max_running_requests=2),
    ],
    ids=["chunk4", "noradix", "tinykv-preempt", "tinykv-preempt-hybrid", "running2"],
)
def test_schedules_leave_greedy_outputs_unchanged(kw):
    eng = engine("e2b", **kw)
    _check("e2b", eng, prompts())
    if "max_total_tokens" in kw:
        assert eng.scheduler.num_retractions > 0, "the tiny KV budget did not force a preemption"


def test_radix_cache_hits_leave_outputs_unchanged_and_are_counted():
    eng = engine("e2b")
    base = prompts(lengths=(30,), seed=5)[0]
    _check("e2b", eng, [base])
    before = eng.work_counters()["cached_tokens"]
    variants = [base[:20] + [7, 8, 9], base + [11], base]
    outs = _check("e2b", eng, variants)
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [20, 30, 29]
    assert eng.work_counters()["cached_tokens"] - before == 79


@pytest.mark.parametrize("one_pool", [True, False])
def test_all_slots_free_after_requests_finish(one_pool):
    eng = engine("e2b", max_total_tokens=200, disable_hybrid_swa_memory=one_pool)
    eng.generate(input_ids=prompts(), sampling_params=GREEDY)
    eng.check_integrity()
    kv = eng.scheduler.kv
    total = eng.runner.max_total_num_tokens
    assert total == 200  # --max-total-tokens: the full-attention budget of the hybrid pool (as in SGLang)
    assert kv.full_available() == total and kv.tree.protected_size == 0
    if not one_pool:
        swa_total = kv.allocator.swa_capacity - 1
        assert kv.swa_available() == swa_total and kv.tree.swa_protected_size == 0
    assert eng.flush_cache() and kv.allocator.available_size() == (200 if one_pool else min(total, swa_total))
