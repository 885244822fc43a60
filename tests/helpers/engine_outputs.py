"""Prompts and per-token logprobs for engine tests that compare runs of ``Engine.generate`` bit for bit."""

from __future__ import annotations

import random


def seeded_prompts(lengths) -> list[list[int]]:
    """One prompt per length: BOS (2), then ids in [16, 500) from ``random.Random(i)`` for the i-th length."""
    out = []
    for seed, n in enumerate(lengths):
        r = random.Random(seed)
        out.append([2] + [r.randrange(16, 500) for _ in range(n - 1)])
    return out


def output_logprobs(outs) -> list[list[float]]:
    """Each output's chosen-token logprobs, from ``Engine.generate(..., return_logprob=True)``'s meta_info."""
    return [[t[0] for t in o["meta_info"]["output_token_logprobs"]] for o in outs]
