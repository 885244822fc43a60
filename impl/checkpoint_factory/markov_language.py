"""A seeded synthetic language with learnable structure, and a tiny target trained on it.

Random-weight targets are unpredictable (their next-next token is almost never a
draft's top-1), so a distilled MTP draft cannot reach a real acceptance length on
them. This module gives the speculative benchmark a target whose greedy
continuations follow rules a draft can learn:

* ``MarkovLanguage(seed)``: a sparse first-order Markov chain over the ordinary
  token ids ``FIRST_ID .. vocab - 1``: every token has ``BRANCHES`` successors
  with the fixed probabilities ``BRANCH_PROBS`` (low entropy: the top successor
  has probability 0.7). ``sample(n, rng)`` draws a sentence; the benchmark and
  the distillation prompts come from it (``prompts``).
* ``train_target(init_path, out_dir, seed)``: the random-weight checkpoint at
  ``init_path`` (for example the ``e2b`` recipe; same config) trained briefly
  with transformers on seeded sentences of the language (next-token cross
  entropy, Adam), written in the HF format. Its greedy continuation of a
  sentence then mostly follows each token's top successor, so it falls into
  the chain's short cycles: a predictable continuation.

Deterministic: one thread, seeded data and initial weights.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property

import torch

FIRST_ID = 8  # ids below are the tokenizer's specials (pad, eos, bos, ...)
BRANCHES = 3
BRANCH_PROBS = (0.7, 0.2, 0.1)
# training of the target (about a minute on one core for the e2b shape)
TRAIN_ITERS = 150
TRAIN_BATCH = 16
TRAIN_LEN = 48
TRAIN_LR = 3e-3


@dataclass(frozen=True)
class MarkovLanguage:
    """Every token ``t`` in ``FIRST_ID .. vocab - 1`` has successors ``succ[t]`` (BRANCHES of them,
    distinct, the most likely first), drawn from ``random.Random(seed)``."""

    vocab: int
    seed: int

    @cached_property
    def successors(self) -> dict[int, tuple[int, ...]]:
        rng = random.Random(self.seed)
        ids = range(FIRST_ID, self.vocab)
        return {t: tuple(rng.sample(ids, BRANCHES)) for t in ids}

    def sample(self, n: int, rng: random.Random) -> list[int]:
        """One sentence of ``n`` tokens: a uniform first token, then successors by ``BRANCH_PROBS``."""
        succ = self.successors
        out = [rng.randrange(FIRST_ID, self.vocab)]
        while len(out) < n:
            out.append(rng.choices(succ[out[-1]], weights=BRANCH_PROBS)[0])
        return out[:n]

    def prompts(self, lengths: list[int], seed: int) -> list[list[int]]:
        """Deterministic prompts of the given lengths (sentences of the language)."""
        rng = random.Random(seed)
        return [self.sample(n, rng) for n in lengths]


def language_for(model_path: str, seed: int) -> MarkovLanguage:
    """The language over the vocabulary of the checkpoint at ``model_path``."""
    from impl.config.model_config import ModelConfig

    return MarkovLanguage(ModelConfig.from_pretrained(model_path).vocab_size, seed)


def train_target(init_path: str, out_dir: str, seed: int, log=None) -> None:
    """Train the checkpoint at ``init_path`` on the language ``MarkovLanguage(vocab, seed)``; write it to ``out_dir``.
    ``log(iteration, loss)`` is called after every step when given."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order: the build is deterministic
    try:
        _train(init_path, out_dir, seed, log)
    finally:
        torch.set_num_threads(threads)


def _train(init_path: str, out_dir: str, seed: int, log) -> None:
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM.from_pretrained(init_path, dtype=torch.float32)
    model.train()
    lang = MarkovLanguage(model.config.vocab_size, seed)
    rng = random.Random(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=TRAIN_LR)
    for it in range(TRAIN_ITERS):
        batch = torch.tensor([lang.sample(TRAIN_LEN, rng) for _ in range(TRAIN_BATCH)], dtype=torch.int64)
        opt.zero_grad()
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        if log is not None:
            log(it, float(loss.detach()))
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)


def yardstick_prompts(model_path: str, language_seed: int, n: int, seed: int) -> list[list[int]]:
    """``n`` sentences of the checkpoint's language, 8-48 tokens long (lengths and sentences from ``seed``): the
    prompts of the accuracy yardstick (bench/accuracy.py) and of the fp8 KV agreement contract."""
    rng = random.Random(seed)
    lengths = [rng.randint(8, 48) for _ in range(n)]
    return language_for(model_path, language_seed).prompts(lengths, seed)
