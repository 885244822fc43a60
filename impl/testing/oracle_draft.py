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

from impl.engine.req import Req

ORACLE_PREFIX = "oracle:"


class OracleDrafter:
    def __init__(self, continue_greedy: Callable[[list[list[int]], int], list[list[int]]]):
        """``continue_greedy(token_lists, n)``: the target's ``n`` greedy next tokens after each list."""
        self.continue_greedy = continue_greedy
        self.cache: dict[tuple[int, ...], list[int]] = {}

    def draft(self, reqs: Sequence[Req], steps: int) -> list[list[int]]:
        keys = [tuple(r.fill_ids) for r in reqs]
        todo = sorted({k for k in keys if len(self.cache.get(k, ())) < steps})
        if todo:
            for k, cont in zip(todo, self.continue_greedy([list(k) for k in todo], steps)):
                self.cache[k] = list(cont)
        return [self.cache[k][:steps] for k in keys]
