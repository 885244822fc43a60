"""Constrained decoding under FROZEN_KV_MTP speculative decoding: drafts are verified against the grammar
(the matcher walks the draft and is rolled back), so the output equals plain decoding's and stays valid."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.engines import engine

SCHEMA = {"type": "object", "properties": {"a": {"enum": ["xy", "z"]}, "b": {"type": "array", "items": {
    "type": "integer", "minimum": 0, "maximum": 50}, "maxItems": 3}}, "required": ["a", "b"]}
GRAMMARS = [{"json_schema": json.dumps(SCHEMA)}, {"regex": r"[a-c]{3,6}\.[0-9]{2}"},
            {"ebnf": 'root ::= "[" [0-9]+ ("," [0-9]+)* "]"'}]
PROMPTS = ["one two three four", "The weather", "q"]


def _base():
    return engine("e2b", attention_backend="torch_native", disable_radix_cache=True)


def _spec(**kw):
    return engine("e2b", attention_backend="torch_native", speculative_algorithm="NEXTN",
                  speculative_draft_model_path=tiny_checkpoint("assistant"), disable_radix_cache=True, **kw)


class ScriptedDrafter:
    """Drafts the reference's constrained continuation for ``good`` steps, then a token the target refuses: the
    matcher walks accepted and rejected drafts in the same round, and must be rolled back after each."""

    def __init__(self, want: dict[tuple[int, ...], list[int]], good: int):
        self.want, self.good = want, good

    def draft(self, reqs, steps):
        out = []
        for r in reqs:
            ref = self.want[tuple(r.origin_input_ids)]
            k = len(r.output_ids)
            d = ref[k : k + min(steps, self.good)]
            out.append((d + [3] * steps)[:steps])  # then <unk>, which no grammar here allows
        return out


@pytest.mark.parametrize("sp", GRAMMARS, ids=["json_schema", "regex", "ebnf"])
def test_mtp_on_equals_off_for_greedy_constrained_outputs(sp):
    sp = {**sp, "temperature": 0, "max_new_tokens": 48}
    ids = [engine("e2b").encode(p) for p in PROMPTS]
    want = [o["output_ids"] for o in _base().generate(input_ids=ids, sampling_params=sp)]
    eng = _spec()
    real = eng.spec_worker.drafter
    try:
        for drafter in (real, ScriptedDrafter({tuple(i): w for i, w in zip(ids, want)}, good=2)):
            eng.spec_worker.drafter = drafter
            before = eng.spec_worker.stats.accepted_drafts
            outs = eng.generate(input_ids=ids, sampling_params=sp)
            assert [o["output_ids"] for o in outs] == want, type(drafter).__name__
            assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs)
        assert eng.spec_worker.stats.accepted_drafts > before, "the scripted drafts were never accepted"
    finally:
        eng.spec_worker.drafter = real


def test_sampled_constrained_outputs_under_mtp_validate():
    eng = _spec()
    outs = eng.generate(PROMPTS, {"json_schema": json.dumps(SCHEMA), "temperature": 0.9, "seed": 11,
                                  "max_new_tokens": 64})
    for o in outs:
        jsonschema.validate(json.loads(o["text"]), SCHEMA)
    out = eng.generate("hi", {"regex": r"(ab|cd){2,4}!", "temperature": 1.0, "seed": 2, "max_new_tokens": 32})
    assert re.fullmatch(r"(ab|cd){2,4}!", out["text"]), out["text"]
    assert eng.spec_worker.stats.verify_rounds > 0
