"""The FROZEN_KV_MTP loop: acceptance rules, and what a user sees from an engine that speculates."""

from __future__ import annotations

import math

import pytest
import torch

from impl.engine.speculative.acceptance import accept_greedy, accept_sampled
from impl.sampling.sampler import SampleRow
from impl.sampling.sampling_params import SamplingParams
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.testing.oracle_draft import OracleDrafter
from tests.helpers.engines import engine, prompts

GREEDY = {"max_new_tokens": 9, "temperature": 0.0, "ignore_eos": True}


def _row(**sp) -> SampleRow:
    return SampleRow(SamplingParams.from_dict(sp), [1, 2], [], torch.Generator().manual_seed(0), return_logprob=True)


def test_greedy_acceptance_takes_the_longest_matching_prefix_plus_the_targets_token():
    logits = torch.full((4, 8), -5.0)
    for row, tok in enumerate([3, 5, 6, 1]):
        logits[row, tok] = 5.0
    out = accept_greedy(logits, _row(temperature=0.0), [3, 5, 7], eos_ids=())
    assert out.tokens == [3, 5, 6] and out.num_accepted_drafts == 2
    out = accept_greedy(logits, _row(temperature=0.0), [3, 5, 6], eos_ids=())
    assert out.tokens == [3, 5, 6, 1] and out.num_accepted_drafts == 3  # all accepted: the bonus row's token too
    out = accept_greedy(logits, _row(temperature=0.0), [0, 5, 6], eos_ids=())
    assert out.tokens == [3] and out.num_accepted_drafts == 0
    assert all(lp is not None and lp < 0 for lp in out.logprobs)


def _gof_p(counts: list[int], probs: list[float]) -> float:
    from contracts.spec_decoding import _chi2_sf

    n = sum(counts)
    stat = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs) if p > 0)
    return _chi2_sf(stat, sum(p > 0 for p in probs) - 1)


@pytest.mark.parametrize("draft_tok", [0, 2, 4])  # the likeliest token, a middling one, one top_k drops
@pytest.mark.slow  # many sampled rounds
def test_rejection_sampling_leaves_the_target_distribution_unchanged(draft_tok):
    """First committed token over 4000 seeded rounds vs the exact truncated target distribution (alpha 1e-4)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, -1.0]] * 2)
    params = dict(temperature=0.8, top_k=4)
    scaled = logits[0] / 0.8
    p = torch.softmax(scaled[:4], dim=-1).tolist() + [0.0]
    counts = [0] * 5
    gen = torch.Generator().manual_seed(1234)
    for _ in range(4000):
        row = SampleRow(SamplingParams.from_dict(params), [1], [], gen)
        counts[accept_sampled(logits, row, [draft_tok], eos_ids=()).tokens[0]] += 1
    assert counts[4] == 0
    assert _gof_p(counts, p) > 1e-4, (counts, p)


def _base():
    return engine("e2b", attention_backend="torch_native", disable_radix_cache=True)


def _spec(draft: str = "assistant", **kw):
    return engine("e2b", attention_backend="torch_native", speculative_algorithm="NEXTN",
                  speculative_draft_model_path=tiny_checkpoint(draft), **kw)


def _oracle_spec():
    e = _spec(max_running_requests=8, disable_radix_cache=True)
    base = _base()

    def cont(lists, n):
        return [o["output_ids"] for o in base.generate(input_ids=lists, sampling_params={**GREEDY, "max_new_tokens": n})]

    e.spec_worker.drafter = OracleDrafter(cont)
    return e


def test_meta_info_and_server_info_report_speculation():
    e = _spec()
    out = e.generate(input_ids=prompts(2), sampling_params=GREEDY)
    for o in out:
        m = o["meta_info"]
        assert m["completion_tokens"] == 9 and m["spec_verify_ct"] >= 1
        assert m["spec_accept_length"] == pytest.approx(8 / m["spec_verify_ct"])  # 1 token from the prefill
    info = e.get_server_info()
    assert info["speculative"]["num_steps"] == 3 and info["speculative"]["mixed_chunked_prefill"] is False
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    assert any("FROZEN_KV_MTP with draft" in line and "steps 3, topk 1, draft tokens 4" in line for line in e.startup_log)
    assert "spec_verify_ct" not in _base().generate(input_ids=prompts(1), sampling_params=GREEDY)[0]["meta_info"]


def test_all_accepted_rounds_stop_at_stop_tokens_and_max_new_tokens_and_free_their_kv():
    e, base = _oracle_spec(), _base()
    ps = prompts(4)
    ref = base.generate(input_ids=ps, sampling_params={**GREEDY, "max_new_tokens": 12}, return_logprob=True)
    got = e.generate(input_ids=ps, sampling_params={**GREEDY, "max_new_tokens": 12}, return_logprob=True)
    for a, b in zip(ref, got):
        assert a["output_ids"] == b["output_ids"]
        assert b["meta_info"]["spec_verify_ct"] == math.ceil(11 / 4)  # every draft accepted
        la = [x for x, _, _ in a["meta_info"]["output_token_logprobs"]]
        lb = [x for x, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4
    # a stop token in the middle of an accepted chain ends the request there
    stop = ref[0]["output_ids"][5]
    cut = ref[0]["output_ids"].index(stop) + 1
    out = e.generate(input_ids=ps[0], sampling_params={**GREEDY, "max_new_tokens": 12, "stop_token_ids": [stop]})
    assert out["output_ids"] == ref[0]["output_ids"][:cut]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    e.check_integrity()
    kv = e.scheduler.kv  # every slot free or evictable, in both pools of the hybrid pool
    assert kv.full_available() == kv.capacity - 1 and kv.swa_available() == kv.allocator.swa_capacity - 1


def test_streaming_with_speculation_ends_with_the_final_output():
    e = _spec()
    chunks = list(e.generate(input_ids=prompts(1)[0], sampling_params=GREEDY, stream=True))
    assert chunks[-1]["output_ids"] == _base().generate(input_ids=prompts(1)[0], sampling_params=GREEDY)["output_ids"]
    lens = [len(c["output_ids"]) for c in chunks]
    assert lens == sorted(lens) and len(chunks) >= 2


@pytest.mark.parametrize("stage", ["verify", "draft"])
def test_a_failing_verify_or_draft_fails_that_round_only(stage):
    """Faults injected by rid (contracts/fault_injection.py). At most two requests run: the first two share
    every round, so both fail (one error final output each, KV freed); the third waits, then runs to the
    tokens of a fault-free run, and the engine stays healthy."""
    from contracts.fault_injection import injected

    e = _spec(max_running_requests=2)
    ps = prompts(3)
    ref = e.generate(input_ids=ps, sampling_params=GREEDY)
    rids = [f"fault-{stage}-a", f"same-round-{stage}-b", f"after-{stage}-c"]
    with injected():
        chunks = list(e.generate(input_ids=ps, sampling_params=GREEDY, stream=True, rid=rids))
    finals: dict[str, list[dict]] = {rid: [] for rid in rids}
    for c in chunks:
        if c["meta_info"]["finish_reason"] is not None:
            finals[c["meta_info"]["id"]].append(c)
    assert all(len(f) == 1 for f in finals.values()), finals
    for rid in rids[:2]:
        fr = finals[rid][0]["meta_info"]["finish_reason"]
        assert fr["type"] == "abort" and fr["status_code"] == 500 and "forward pass" in fr["message"], fr
    assert finals[rids[2]][0]["output_ids"] == ref[2]["output_ids"]
    assert e.health() is None
    e.check_integrity()
    kv = e.scheduler.kv  # every slot free or evictable, in both pools of the hybrid pool
    assert kv.full_available() == kv.capacity - 1 and kv.swa_available() == kv.allocator.swa_capacity - 1
