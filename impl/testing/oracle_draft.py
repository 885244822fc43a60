"""An oracle drafter for tests: it proposes the target's own greedy next tokens.

It asks a reference (non-speculative) engine on the same target for the greedy
continuation of each request's tokens so far (cached per token sequence), so every
draft of a greedy request is accepted: the all-accepted path and the
``max_new_tokens`` cut of a round are exercised deterministically. Installed by
the contracts' impl adapter (``--speculative-draft-model-path oracle:<assistant>``);
never used in serving.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from impl.engine.req import Req

ORACLE_PREFIX = "oracle:"


class OracleDrafter:
    """``continue_greedy(token_lists, n)``: the target's ``n`` greedy next tokens after each list.

    ``seed_logits(hidden [B, D]) -> [B, V]``: the target's LM head. When given, the oracle checks
    the loop's seed: a greedy request's seed hidden must be the row that produced its bonus token,
    so the target's argmax of it is that token. A request whose seed fails the check gets a draft
    the target rejects, so a wrong seed shows as lost acceptance."""

    def __init__(self, continue_greedy: Callable[[list[list[int]], int], list[list[int]]],
                 seed_logits: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.continue_greedy = continue_greedy
        self.seed_logits = seed_logits
        self.cache: dict[tuple[int, ...], list[int]] = {}
        self.bad_seeds = 0

    def draft(self, reqs: Sequence[Req], steps: int) -> list[list[int]]:
        keys = [tuple(r.fill_ids) for r in reqs]
        todo = sorted({k for k in keys if len(self.cache.get(k, ())) < steps})
        if todo:
            for k, cont in zip(todo, self.continue_greedy([list(k) for k in todo], steps)):
                self.cache[k] = list(cont)
        good = self._seed_ok(reqs)
        # a failed seed check gets a first draft the target certainly rejects (not its greedy token)
        return [self.cache[k][:steps] if ok else [self.cache[k][0] ^ 1] * steps for k, ok in zip(keys, good)]

    def _seed_ok(self, reqs: Sequence[Req]) -> list[bool]:
        if self.seed_logits is None:
            return [True] * len(reqs)
        with torch.no_grad():
            top = self.seed_logits(torch.stack([r.seed_hidden() for r in reqs])).argmax(dim=-1).tolist()
        ok = [not r.sampling_params.is_greedy or t == r.output_ids[-1] for t, r in zip(top, reqs)]
        self.bad_seeds += ok.count(False)
        return ok
