"""Beam search (impl/server/beam_search.py) over a hand-made next-token table: stop tokens, length penalty,
include_stop, and the steps it submits (no model)."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

from impl.engine.output import Logprobs, ReqOutput
from impl.server.beam_search import BeamSpec, search

EOS = 9
# next-token probabilities after each output so far (prompt [0]); anything else: token 3 surely
TABLE = {
    (): {1: 0.5, 2: 0.3, EOS: 0.2},
    (1,): {EOS: 0.9, 3: 0.1},
    (2,): {3: 0.6, 1: 0.4},
    (2, 3): {3: 0.7, EOS: 0.3},
    (2, 1): {EOS: 0.5, 3: 0.5},
}


class _Stream:
    def __init__(self, out: ReqOutput):
        self.final = out
        self.rid = out.rid

    async def result(self) -> ReqOutput:
        return self.final


class FakeAsyncEngine:
    def __init__(self):
        self.steps: list[list[tuple[int, ...]]] = []  # the outputs so far each step asked about
        self.engine = SimpleNamespace(
            scheduler_config=SimpleNamespace(eos_token_ids=(EOS,)),
            tokenizer=SimpleNamespace(decode=lambda ids, skip=True: " ".join(map(str, ids))),
            expand_requests=self._expand)

    def _expand(self, prompts, sampling, ret, start, k, rids):
        assert sampling == {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True} and ret and start is None
        return [SimpleNamespace(rid=r, prompt=tuple(p[1:]), k=k, cache_namespace=0) for p, r in zip(prompts, rids)]

    def submit(self, reqs, stream):
        self.steps.append([r.prompt for r in reqs])
        outs = []
        for r in reqs:
            probs = TABLE.get(r.prompt, {3: 1.0})
            top = sorted(((math.log(p), t) for t, p in probs.items()), reverse=True)[: r.k]
            lp = Logprobs([], [(top[0][0], top[0][1])], [], [top], r.k)
            outs.append(ReqOutput(r.rid, "", "", [top[0][1]], None, 1, 1, 0, 0.0, logprobs_delta=lp))
        return [_Stream(o) for o in outs]

    def abort(self, rid):
        raise AssertionError("nothing to abort")


def _run(width=2, max_tokens=3, length_penalty=1.0, include_stop=False, ignore_eos=False, top=0):
    sp = SimpleNamespace(max_new_tokens=max_tokens, ignore_eos=ignore_eos, skip_special_tokens=True)
    template = SimpleNamespace(rid="r", origin_input_ids=[0], sampling_params=sp, cache_namespace=0)
    fake = FakeAsyncEngine()
    outs = asyncio.run(search(fake, template, BeamSpec(width, length_penalty, include_stop), top))
    return outs, fake


def test_beams_rank_finished_and_live_sequences():
    outs, fake = _run(length_penalty=0.0)  # by cumulative logprob alone
    # [1, EOS] = .45 beats [2, 3, 3] = .126, [EOS] = .2; it stopped at EOS (dropped from the ids)
    assert [o.output_ids_delta for o in outs] == [[1], []]
    assert [o.finish_reason.type for o in outs] == ["stop", "stop"] and outs[0].text == "1"
    assert sum(lp for lp, _ in outs[0].logprobs_delta.output_token_logprobs) == math.log(0.5)  # the EOS's is not shown
    # step 1 asks about the empty output, step 2 about the two best live beams, step 3 about theirs
    assert fake.steps == [[()], [(1,), (2,)], [(2, 3), (2, 1)]]


def test_length_penalty_and_include_stop():
    # a strong length penalty divides by (prompt + output) ** 3: the longest sequences win
    outs, _ = _run(length_penalty=3.0)
    assert all(len(o.output_ids_delta) >= 2 for o in outs)
    # include_stop keeps the stop token in the ids (not in the text) and its logprob
    outs, _ = _run(length_penalty=0.0, include_stop=True)
    assert outs[0].output_ids_delta == [1, EOS] and outs[0].text == "1" and outs[0].completion_tokens == 2
    assert len(outs[0].logprobs_delta.output_token_logprobs) == 2


def test_ignore_eos_width_one_and_empty():
    outs, _ = _run(width=1, ignore_eos=True, max_tokens=2)
    assert outs[0].output_ids_delta == [1, EOS] and outs[0].finish_reason.type == "length"  # greedy, EOS a token
    outs, fake = _run(width=3, max_tokens=0)
    assert [o.output_ids_delta for o in outs] == [[], [], []] and fake.steps == []
