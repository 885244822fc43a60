"""Constrained decoding in the engine on the tiny random-weight checkpoints: unconstrained, their output is
noise; the grammar is what makes it valid. Every grammar here completes within its token budget."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from impl.engine.intake import InvalidRequest
from tests.helpers.engines import engine

GREEDY = {"temperature": 0, "max_new_tokens": 48}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "enum": ["ada", "bob", "cy"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["name", "age", "tags"]}


def _gen(eng, sp, prompt="The weather today", **kw):
    return eng.generate(prompt, {**GREEDY, **sp}, **kw)


def test_json_schema_output_validates_and_finishes_with_stop():
    out = _gen(engine("e2b"), {"json_schema": json.dumps(PERSON)})
    jsonschema.validate(json.loads(out["text"]), PERSON)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_unconstrained_output_of_the_same_prompt_is_not_json():
    with pytest.raises(ValueError):
        json.loads(_gen(engine("e2b"), {})["text"])


@pytest.mark.parametrize("regex", [r"[0-9]{3}-[a-z]{2,4}", r"(yes|no|maybe)", r"\d+\.\d\d"])
def test_regex_output_fullmatches(regex):
    out = _gen(engine("e2b"), {"regex": regex})
    assert re.fullmatch(regex, out["text"]), out["text"]


def test_ebnf_output_is_in_the_language():
    grammar = 'root ::= "(" expr ")"\nexpr ::= [0-9] | [0-9] [+*] expr'
    out = _gen(engine("e2b"), {"ebnf": grammar})
    assert re.fullmatch(r"\(\d([+*]\d)*\)", out["text"]), out["text"]


def test_n_choices_each_get_their_own_matcher():
    outs = _gen(engine("e2b"), {"regex": r"[a-e]{2,6}!", "temperature": 1.0, "seed": 7, "n": 3})
    texts = [o["text"] for o in outs]
    assert all(re.fullmatch(r"[a-e]{2,6}!", t) for t in texts), texts
    assert len(set(texts)) > 1, "seeded choices should differ"


def test_sampled_constrained_output_validates():
    out = _gen(engine("e2b"), {"json_schema": json.dumps(PERSON), "temperature": 1.0, "top_p": 0.9, "seed": 3,
                               "repetition_penalty": 1.2})
    jsonschema.validate(json.loads(out["text"]), PERSON)


def test_logprobs_see_the_masked_distribution():
    out = _gen(engine("e2b"), {"regex": "(yes|no)"}, return_logprob=True, top_logprobs_num=5)
    firsts = out["meta_info"]["output_top_logprobs"][0]
    # only 'y...' / 'n...' tokens have mass: every other top entry is -inf
    allowed = [e[0] for e in firsts if e[0] != float("-inf")]
    assert allowed and abs(sum(__import__("math").exp(x) for x in allowed) - 1.0) < 1e-4


def test_logit_bias_forces_and_forbids_tokens():
    eng = engine("e2b")
    tok = eng.encode("a")[-1]
    forced = _gen(eng, {"max_new_tokens": 4, "logit_bias": {str(tok): 100}})
    assert forced["output_ids"] == [tok] * 4
    base = _gen(eng, {"max_new_tokens": 4})
    banned = _gen(eng, {"max_new_tokens": 4, "logit_bias": {str(base["output_ids"][0]): -100}})
    assert banned["output_ids"][0] != base["output_ids"][0]


def test_chunked_prefill_radix_cache_and_preemption_leave_constrained_outputs_unchanged():
    sp = {"json_schema": json.dumps(PERSON), "max_new_tokens": 40}
    prompt = "one two three four five six"
    ref = _gen(engine("e2b"), sp, prompt)["output_ids"]
    for kw in (dict(chunked_prefill_size=4), dict(attention_backend="torch_native", disable_radix_cache=True),
               dict(max_total_tokens=60, chunked_prefill_size=16, disable_hybrid_swa_memory=True)):
        eng = engine("e2b", **kw)
        outs = eng.generate([prompt] * 3, {**GREEDY, **sp})
        assert [o["output_ids"] for o in outs] == [ref] * 3, kw
        if "max_total_tokens" in kw:
            assert eng.scheduler.num_retractions > 0, "the tiny KV budget did not force a retraction"
    again = _gen(engine("e2b"), sp, prompt)  # a radix-cache hit on the same engine
    assert again["output_ids"] == ref and again["meta_info"]["cached_tokens"] > 0


@pytest.mark.parametrize("source,field", [
    ({"regex": "((("}, "regex"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": "[1, 2]"}, "json_schema"),
    ({"ebnf": "root ::= undefined_rule"}, "ebnf"),
    ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "#/missing"}}})}, "json_schema"),
])
def test_bad_grammars_are_refused_naming_the_field(source, field):
    with pytest.raises(InvalidRequest) as e:
        _gen(engine("e2b"), source)
    assert e.value.field == field and field in str(e.value)


def _deep(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


@pytest.mark.parametrize("name,sp", [
    ("deep nesting", {"json_schema": json.dumps(_deep(400))}),
    ("huge enum", {"json_schema": json.dumps({"enum": [f"v{i}" for i in range(5000)]})}),
    ("1 MB schema", {"json_schema": json.dumps({"type": "string", "description": "x" * 2**20})}),
    ("huge repetition", {"regex": "(a|b){100000}"}),
    ("huge ebnf", {"ebnf": "root ::= " + " | ".join(f'"{i}"' for i in range(40000))}),
])
def test_hostile_grammars_are_refused_quickly(name, sp):
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequest):
        _gen(engine("e2b"), sp)
    assert time.perf_counter() - t0 < 2.0, name


def test_grammar_compiles_are_cached_by_source():
    eng = engine("e2b")
    src = json.dumps({"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]})
    _gen(eng, {"json_schema": src, "max_new_tokens": 12})
    t0 = time.perf_counter()
    eng.grammar_backend.compile(__import__("impl.constrained.grammar", fromlist=["GrammarKey"]).GrammarKey("json_schema", src))
    assert time.perf_counter() - t0 < 0.05
