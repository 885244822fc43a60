"""Sampler and SamplingParams on hand-made logits (no model)."""

import pytest
import torch

from impl.sampling.sampler import SampleRow, sample
from impl.sampling.sampling_params import SamplingParams


def row(prompt=(), out=(), seed=0, lp=False, top=0, **kw):
    return SampleRow(SamplingParams.from_dict(kw), list(prompt), list(out), torch.Generator().manual_seed(seed), lp, top)


LOGITS = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]])


def test_greedy_is_argmax_with_logprobs_and_top_k():
    out = sample(LOGITS, [row(temperature=0.0, lp=True, top=2)], eos_ids=[])
    assert out.token_ids == [1]
    lsm = torch.log_softmax(LOGITS[0], -1)
    assert out.logprobs[0] == pytest.approx(float(lsm[1]))
    assert [t for _, t in out.top_logprobs[0]] == [1, 2]
    assert sample(LOGITS, [row(top_k=1)], eos_ids=[]).token_ids == [1]  # top_k 1 is greedy


def test_top_k_top_p_min_p_restrict_the_support():
    logits = LOGITS.repeat(200, 1)

    def seen(**kw):
        return set(sample(logits, [row(seed=i, **kw) for i in range(200)], []).token_ids)

    assert seen(top_k=2) == {1, 2}
    assert seen(top_p=0.5) <= {1, 2} and 1 in seen(top_p=0.5)
    assert seen(top_p=0.01) == {1}
    assert seen(min_p=0.5) == {1, 2}
    assert seen() == {0, 1, 2, 3, 4}


def test_seeded_draw_does_not_depend_on_batch_neighbours():
    alone = sample(LOGITS, [row(seed=7)], []).token_ids
    other = torch.randn(3, 5)
    batched = sample(torch.cat([other[:1], LOGITS, other[1:]]), [row(seed=1), row(seed=7), row(seed=2), row(seed=3)], [])
    assert batched.token_ids[1] == alone[0]
    # a fresh generator with the same seed repeats a whole sequence
    g = row(seed=5)
    b = [sample(LOGITS, [g], []).token_ids[0] for _ in range(5)]
    g2 = row(seed=5)
    assert b == [sample(LOGITS, [g2], []).token_ids[0] for _ in range(5)]


def test_penalties_change_the_choice():
    # token 1 already generated twice: frequency penalty 1.0 drops it below token 2
    assert sample(LOGITS, [row(out=[1, 1], temperature=0, frequency_penalty=1.0)], []).token_ids == [2]
    assert sample(LOGITS, [row(out=[1], temperature=0, presence_penalty=0.5)], []).token_ids == [2]
    # repetition penalty counts prompt tokens too
    assert sample(LOGITS, [row(prompt=[1], temperature=0, repetition_penalty=2.0)], []).token_ids == [2]
    # min_new_tokens masks EOS and stop tokens
    assert sample(LOGITS, [row(temperature=0, min_new_tokens=1, max_new_tokens=4, stop_token_ids=[2])], eos_ids=[1]).token_ids == [4]


def test_temperature_flattens_reported_logprobs():
    out = sample(LOGITS, [row(temperature=2.0, lp=True, seed=3)], [])
    lsm = torch.log_softmax(LOGITS[0] / 2.0, -1)
    assert out.logprobs[0] == pytest.approx(float(lsm[out.token_ids[0]]))


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("min_p", 2.0), ("top_k", 0), ("top_k", -2),
        ("frequency_penalty", 3.0), ("presence_penalty", -2.5), ("repetition_penalty", 0.0),
        ("max_new_tokens", -1), ("n", 0), ("stop_token_ids", [-1]), ("temperature", "hot"), ("seed", 1.5),
    ],
)
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


def test_unknown_field_and_min_new_tokens():
    with pytest.raises(ValueError, match="tempreature"):
        SamplingParams.from_dict({"tempreature": 1.0})
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams.from_dict({"min_new_tokens": 5, "max_new_tokens": 2})
    assert SamplingParams.from_dict({"stop": "x"}).stop == ["x"]
    assert SamplingParams.from_dict({"sampling_seed": 3}).seed == 3


def test_allowed_token_ids_and_bad_words():
    """vLLM's allowed_token_ids keep only their tokens (the reported logprobs over them); a bad word's last token is
    masked where the output ends with the rest of it, a one-token word always; a row left with nothing is refused."""
    logits = LOGITS.repeat(100, 1)
    drawn = sample(logits, [row(seed=i, allowed_token_ids=[0, 3]) for i in range(100)], []).token_ids
    assert set(drawn) == {0, 3}
    g = sample(LOGITS, [row(temperature=0, allowed_token_ids=[3, 4], lp=True)], [])
    assert g.token_ids == [4] and g.logprobs[0] == pytest.approx(float(torch.log_softmax(LOGITS[0, [3, 4]], -1)[1]))
    assert sample(LOGITS, [row(temperature=0, bad_words_token_ids=[[1]])], []).token_ids == [2]
    pair = [[4, 1]]  # "4 then 1": 1 is masked only right after a 4
    assert sample(LOGITS, [row(out=[4], temperature=0, bad_words_token_ids=pair)], []).token_ids == [2]
    assert sample(LOGITS, [row(out=[3], temperature=0, bad_words_token_ids=pair)], []).token_ids == [1]
    assert sample(LOGITS, [row(temperature=0, bad_words_token_ids=pair)], []).token_ids == [1]
    with pytest.raises(ValueError, match="allowed_token_ids"):  # allowed = {1}, which min_new_tokens masks as EOS
        sample(LOGITS, [row(temperature=0, allowed_token_ids=[1], min_new_tokens=1, max_new_tokens=2)], eos_ids=[1])
    for bad in ({"allowed_token_ids": []}, {"allowed_token_ids": [5]}, {"bad_words_token_ids": [[]]},
                {"bad_words_token_ids": [[1]] * 257}):
        with pytest.raises(ValueError, match="allowed_token_ids|bad words"):
            SamplingParams.from_dict(bad, vocab_size=5)
