"""Gemma-4's 262,144-entry vocabulary (issue 22): sampling, logprobs, the detokenizer and stop strings.

The sampler is checked against a plain reference (full log-softmax, full sort) on hand-made logits at
that size; the engine end to end on ``vocab262k`` (2 layers, a 262144-entry tokenizer)."""

from __future__ import annotations

import random

import pytest
import torch

from impl.engine.detokenizer import IncrementalDetokenizer
from impl.sampling import sampler
from impl.sampling.sampler import SampleRow, sample, truncated_probs
from impl.sampling.sampling_params import SamplingParams
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

V = 262144


def _row(seed=0, lp=False, top=0, out=(), **kw):
    return SampleRow(SamplingParams.from_dict(kw), [1, 2, 3], list(out), torch.Generator().manual_seed(seed), lp, top)


def _reference_truncated(scaled: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The rule as written: sort everything, keep the prefix top-k / top-p / min-p allow, renormalise."""
    probs, idx = torch.sort(torch.softmax(scaled.double(), -1), descending=True)
    ranks = torch.arange(V)
    drop = ranks >= (p.top_k if p.top_k > 0 else V)
    drop |= (torch.cumsum(probs, -1) - probs) >= p.top_p
    drop |= probs < p.min_p * probs[0]
    drop[0] = False
    kept = probs.masked_fill(drop, 0.0)
    return torch.zeros(V, dtype=torch.float64).scatter_(0, idx, kept / kept.sum())


PARAMS = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=40),
          dict(temperature=1.0, min_p=0.05), dict(temperature=0.8, top_p=0.95, top_k=100),
          dict(temperature=1.0, top_k=5000, top_p=0.6)]


@pytest.mark.parametrize("scale", [0.5, 4.0, 12.0])  # flat (the radix path) to peaked (the candidates path)
def test_truncation_equals_the_sorted_rule(scale):
    logits = torch.randn(len(PARAMS), V, generator=torch.Generator().manual_seed(1)) * scale
    rows = [_row(**kw) for kw in PARAMS]
    scaled = sampler.penalised_scaled(logits, rows, [])
    got = truncated_probs(scaled, rows).double()
    for i, r in enumerate(rows):
        want = _reference_truncated(scaled[i], r.params)
        # total variation: float32 vs float64 sums decide a few boundary tokens of mass ~1e-6 differently
        assert (got[i] - want).abs().sum().item() / 2 < 1e-4, PARAMS[i]


def test_logprobs_and_top_logprobs_over_the_full_vocabulary():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(2)) * 3
    rows = [_row(lp=True, top=5, temperature=0.0), _row(seed=4, lp=True, top=3, temperature=0.7),
            _row(seed=5, lp=True, top=2, temperature=1.0, top_p=0.5, frequency_penalty=0.5, out=[7, 7, 9])]
    out = sample(logits, rows, eos_ids=[1])
    for i, r in enumerate(rows):
        ref = logits[i].clone()
        if i == 2:
            ref[7] -= 2 * 0.5
            ref[9] -= 0.5
        t = 1.0 if r.params.is_greedy else r.params.temperature
        lsm = torch.log_softmax(ref / t, -1)
        assert out.logprobs[i] == pytest.approx(float(lsm[out.token_ids[i]]), abs=1e-4)
        v, idx = torch.topk(lsm, r.top_logprobs_num)
        assert [t for _, t in out.top_logprobs[i]] == idx.tolist()
        assert [x for x, _ in out.top_logprobs[i]] == pytest.approx(v.tolist(), abs=1e-4)
    assert out.token_ids[0] == int(logits[0].argmax())


def test_penalties_touch_only_named_tokens():
    logits = torch.zeros(1, V)
    out = sampler._penalised(logits, [_row(out=[5, 5, 262143], presence_penalty=0.5, frequency_penalty=1.0,
                                          repetition_penalty=2.0)], [])
    changed = torch.nonzero(out[0]).flatten().tolist()  # -(2 x 1.0 + 0.5), then x 2 (repetition, negative logit)
    assert changed == [5, 262143] and float(out[0, 5]) == pytest.approx(-5.0) and torch.equal(logits, torch.zeros(1, V))


@pytest.mark.slow  # a 262144-entry tokenizer
def test_detokenizer_over_random_ids_of_the_262144_entry_tokenizer():
    from impl.model.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_checkpoint("vocab262k"))
    assert tok.vocab_size == V
    r = random.Random(3)
    ids = [r.randrange(6, V) for _ in range(300)]  # many 2-3 byte pieces, partial UTF-8 characters
    d = IncrementalDetokenizer(tok)
    text = "".join(d.step([i]) for i in ids) + d.finish()
    assert text == tok.decode(ids)


@pytest.mark.slow  # a 262144-entry vocabulary
def test_engine_samples_and_stops_on_strings_with_262144_entries():
    from impl.engine.engine import Engine

    eng = Engine(tiny_checkpoint("vocab262k"), max_total_tokens=2048, random_seed=0)
    try:
        prompt = eng.encode("The quick brown fox jumps over the lazy dog.")
        greedy = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 24, "temperature": 0,
                                                                 "ignore_eos": True},
                              return_logprob=True, top_logprobs_num=5)
        assert len(greedy["output_ids"]) == 24 and max(greedy["output_ids"]) < V
        tops = greedy["meta_info"]["output_top_logprobs"]
        assert all(t[0][1] == i for t, i in zip(tops, greedy["output_ids"]))  # greedy: the top-1 is the token
        for kw in (dict(top_p=0.9), dict(top_k=50, min_p=0.01), dict(top_p=0.8, presence_penalty=1.0)):
            out = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 1.0, "seed": 1,
                                                                  "ignore_eos": True, **kw})
            assert len(out["output_ids"]) == 8 and max(out["output_ids"]) < V
        text = greedy["text"]
        stop = next(text[k:k + 3] for k in range(len(text) // 2, len(text) - 3) if "\ufffd" not in text[k:k + 3])
        stopped = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 24, "temperature": 0,
                                                                  "ignore_eos": True, "stop": [stop]})
        assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert stopped["text"] == text[: text.index(stop)]
    finally:
        eng.shutdown()
