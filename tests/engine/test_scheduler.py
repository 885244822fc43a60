"""Scheduler policy on a model-free runner: every schedule gives the same tokens."""

import pytest

from impl.engine.intake import IntakePolicy, InvalidRequest, validate_req
from impl.engine.scheduler import Scheduler
from tests.helpers.fake_runner import VOCAB, context_logits, make_req, make_scheduler, run

PROMPTS = [[2, 5, 7, 3, 9, 11, 4, 6, 8, 10, 12, 13], [2, 5, 7], [2, 5, 7, 3, 9, 14], [3], [2, 4, 6, 8, 10, 12, 14, 3, 5, 7]]


def _reqs(max_new=10, **kw):
    return [make_req(f"r{i}", p, max_new_tokens=max_new, ignore_eos=True, **kw) for i, p in enumerate(PROMPTS)]


def _outputs(sched, **kw):
    return [r.output_ids for r in run(sched, _reqs(**kw))]


def _reference(prompt, n):
    """Greedy decoding one token at a time straight from the context function."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(context_logits(ids).argmax()))
    return ids[len(prompt):]


def test_greedy_matches_the_context_function():
    assert _outputs(make_scheduler()) == [_reference(p, 10) for p in PROMPTS]


@pytest.mark.parametrize(
    "kw",
    [
        dict(chunk=3),
        dict(chunk=1),
        dict(radix=False),
        dict(max_running=1),
        dict(max_prefill=4),
        dict(total_tokens=30, max_len=30),  # forces retraction
        dict(total_tokens=30, max_len=30, chunk=4, radix=False),
    ],
    ids=["chunk3", "chunk1", "noradix", "running1", "prefill4", "tinykv", "tinykv-chunk-noradix"],
)
def test_schedules_leave_greedy_outputs_unchanged(kw):
    assert _outputs(make_scheduler(**kw)) == [_reference(p, 10) for p in PROMPTS]


def test_tiny_kv_budget_retracts_and_still_finishes():
    sched = make_scheduler(total_tokens=30, max_len=30)
    run(sched, _reqs())
    assert sched.num_retractions > 0
    assert sched.kv.allocator.available_size() + sched.kv.tree.evictable_size == 30


def test_radix_hits_reuse_prefix_and_count_cached_tokens():
    sched = make_scheduler()
    run(sched, [make_req("a", [2, 5, 7, 3, 9, 11], max_new_tokens=2, ignore_eos=True)])
    b = run(sched, [make_req("b", [2, 5, 7, 3, 9, 13], max_new_tokens=2, ignore_eos=True)])[0]
    assert b.cached_tokens == 5
    assert sched.runner.work.cached_tokens == 5
    assert b.output_ids == _reference([2, 5, 7, 3, 9, 13], 2)
    # a full-prompt hit still recomputes the last prompt token (its logits are needed)
    c = run(sched, [make_req("c", [2, 5, 7, 3, 9, 11], max_new_tokens=2, ignore_eos=True)])[0]
    assert c.cached_tokens == 5 and c.output_ids == _reference([2, 5, 7, 3, 9, 11], 2)


def test_cache_salt_keeps_prefixes_apart():
    """Requests share cached prefixes only within one cache namespace (a salt): another salt, or none, misses."""
    from impl.engine.intake import cache_namespace

    sched = make_scheduler()
    p = [2, 5, 7, 3, 9, 11]
    a, b = cache_namespace("tenant-a"), cache_namespace("tenant-b")
    assert a != b and a > 2**32 and cache_namespace(None) == 0
    run(sched, [make_req("a1", p, max_new_tokens=1, cache_namespace=a)])
    hits = {}
    for rid, ns in (("none", 0), ("b1", b), ("a2", a)):
        hits[rid] = run(sched, [make_req(rid, p, max_new_tokens=2, ignore_eos=True, cache_namespace=ns)])[0]
    assert [hits[r].cached_tokens for r in ("none", "b1", "a2")] == [0, 0, 5]
    assert hits["a2"].output_ids == hits["none"].output_ids == _reference(p, 2)  # the same tokens either way
    sched.check_integrity()


def test_chunked_prefill_splits_and_mixes_with_decode():
    sched = make_scheduler(chunk=4)
    run(sched, _reqs(max_new=3))
    kinds = sched.runner.batches
    assert all(sum(lens) <= 4 + 5 for _, lens in kinds)  # prefill chunk <= 4, plus one row per decode
    assert any(mode == "extend" and 1 in lens and max(lens) > 1 for mode, lens in kinds), "no mixed batch"
    assert any(mode == "decode" for mode, _ in kinds)


@pytest.mark.parametrize("block", [256, 2])  # (2: the prompt's rows in several blocks of the output processor)
def test_prompt_logprobs_follow_sglang_definition_under_chunking_and_cache(block, monkeypatch):
    import torch

    from impl.engine import output_processor

    monkeypatch.setattr(output_processor, "PROMPT_LOGPROB_BLOCK", block)

    prompt = PROMPTS[0]
    want = [None] + [float(torch.log_softmax(context_logits(prompt[:j]), -1)[prompt[j]]) for j in range(1, len(prompt))]
    # vLLM's rank: the tokens at least as likely as the prompt token (itself included)
    ranks = [None] + [int((context_logits(prompt[:j]) >= context_logits(prompt[:j])[prompt[j]]).sum())
                      for j in range(1, len(prompt))]
    assert len(set(ranks[1:])) > 1
    for kw in (dict(), dict(chunk=3), dict(total_tokens=30, max_len=30)):
        sched = make_scheduler(**kw)
        run(sched, [make_req("warm", prompt[:8], max_new_tokens=1)])  # cache part of the prompt
        for start in (0, 5):
            r = run(sched, [make_req("x", prompt, max_new_tokens=3, return_logprob=True, logprob_start_len=start,
                                     top_logprobs_num=2, input_token_ranks=[])])[0]
            assert r.input_token_ranks == ranks[start:]
            got = [lp for lp, _ in r.input_token_logprobs]
            assert [t for _, t in r.input_token_logprobs] == prompt[start:]
            assert got[0] is None if start == 0 else got[0] == pytest.approx(want[start], abs=1e-5)
            assert got[1:] == pytest.approx(want[start + 1 :], abs=1e-5)
            assert len(r.input_top_logprobs) == len(prompt) - start and len(r.output_token_logprobs) == 3
            tops = [torch.topk(context_logits(prompt[:j]), 2).indices.tolist() for j in range(max(start, 1), len(prompt))]
            assert [[t for _, t in e] for e in r.input_top_logprobs if e is not None] == tops


def test_stop_tokens_eos_and_max_new_tokens():
    ref = _reference(PROMPTS[0], 10)
    stop_tok = ref[3]
    first = ref.index(stop_tok)
    sched = make_scheduler(eos=(ref[2],))
    a, b, c, d = run(sched, [
        make_req("a", PROMPTS[0], max_new_tokens=10, stop_token_ids=[stop_tok], ignore_eos=True),
        make_req("b", PROMPTS[0], max_new_tokens=10),
        make_req("c", PROMPTS[0], max_new_tokens=2, ignore_eos=True),
        make_req("d", PROMPTS[0], max_new_tokens=0, return_logprob=True, logprob_start_len=0),
    ])
    assert a.output_ids == ref[: first + 1] and a.finished_reason.to_json() == {"type": "stop", "matched": stop_tok}
    assert b.output_ids == ref[: ref.index(ref[2]) + 1] and b.finished_reason.matched == ref[2]
    assert c.finished_reason.to_json() == {"type": "length", "length": 2}
    assert d.output_ids == [] and len(d.input_token_logprobs) == len(PROMPTS[0])


def test_abort_waiting_and_running_frees_everything():
    sched = make_scheduler(max_running=1)
    reqs = _reqs(max_new=50)
    for r in reqs:
        sched.add_request(r)
    for _ in range(3):
        sched.step()
    sched.abort_request("r0")
    sched.abort_request("r3")
    sched.step()
    assert reqs[0].finished_reason.type == "abort" and reqs[3].finished_reason.type == "abort"
    sched.abort_request(None)
    sched.step()
    assert all(r.is_finished for r in reqs) and not sched.has_work
    sched.check_integrity()
    assert sched.kv.tree.protected_size == 0


def test_seeded_sampling_is_independent_of_batch():
    def one(batch_extra):
        reqs = [make_req("s", PROMPTS[0], seed=11, temperature=1.0, max_new_tokens=12, ignore_eos=True)]
        reqs += [make_req(f"o{i}", p, seed=i, temperature=1.0, max_new_tokens=5) for i, p in enumerate(batch_extra)]
        return run(make_scheduler(chunk=3), reqs)[0].output_ids

    assert one([]) == one(PROMPTS[1:]) == one(PROMPTS[2:4])


def test_validate_rejects_unservable_requests():
    sched: Scheduler = make_scheduler(total_tokens=20, max_len=20)
    limits = IntakePolicy(sched.config.max_req_len, sched.config.vocab_size)
    with pytest.raises(InvalidRequest, match="prompt has 25 tokens") as e:
        validate_req(make_req("x", [2] * 25), limits)
    assert e.value.field == "input_ids"
    with pytest.raises(ValueError, match="empty"):
        validate_req(make_req("x", []), limits)
    with pytest.raises(ValueError, match="input_ids"):
        validate_req(make_req("x", [VOCAB + 3]), limits)
    with pytest.raises(InvalidRequest, match="logprob_start_len") as e:
        validate_req(make_req("x", [2, 3], return_logprob=True, logprob_start_len=2), limits)
    assert e.value.field == "logprob_start_len"
