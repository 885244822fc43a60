"""The benchmark pair's synthetic language (impl/checkpoint_factory/markov_language.py) and its on-demand recipes.

The trained checkpoints themselves are built by ``make bench-spec`` only (about a minute): here the
language's rules, the recipes, and a few training steps (the loss falls, the result is a checkpoint)."""

from __future__ import annotations

import pytest
import random

from impl.checkpoint_factory import checkpoints as ck
from impl.checkpoint_factory import markov_language as ml


def test_language_is_seeded_sparse_and_sentences_follow_it():
    a, b = ml.MarkovLanguage(512, 12), ml.MarkovLanguage(512, 13)
    succ = a.successors
    assert succ == ml.MarkovLanguage(512, 12).successors != b.successors
    assert sorted(succ) == list(range(ml.FIRST_ID, 512))
    assert all(len(set(s)) == ml.BRANCHES and min(s) >= ml.FIRST_ID for s in succ.values())
    prompts = a.prompts([1, 5, 40], seed=7)
    assert prompts == a.prompts([1, 5, 40], seed=7) != a.prompts([1, 5, 40], seed=8)
    assert [len(p) for p in prompts] == [1, 5, 40]
    for p in prompts:
        assert all(y in succ[x] for x, y in zip(p, p[1:]))
    # low entropy: the top successor is the most frequent next token
    s = a.sample(4000, random.Random(0))
    top = sum(y == succ[x][0] for x, y in zip(s, s[1:])) / (len(s) - 1)
    assert abs(top - ml.BRANCH_PROBS[0]) < 0.03


def test_markov_recipes_are_on_demand_and_shaped_like_their_sources():
    target, draft = ck.TINY_CHECKPOINTS["e2b_markov"], ck.TINY_CHECKPOINTS["assistant_markov"]
    assert target.kind == "trained" and target.on_demand and draft.on_demand
    assert target.text_config == ck.TINY_CHECKPOINTS[target.train_from].text_config
    assert draft.distill_from == ("e2b_markov", "assistant") and ck.ASSISTANT_TARGETS["assistant_markov"] == "e2b_markov"


@pytest.mark.slow  # trains
def test_a_few_training_steps_lower_the_loss_and_write_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(ml, "TRAIN_ITERS", 6)
    losses = []
    ml.train_target(ck.tiny_checkpoint("e2b"), str(tmp_path), seed=12, log=lambda i, loss: losses.append(loss))
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.2, losses
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
