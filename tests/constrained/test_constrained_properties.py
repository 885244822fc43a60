"""Properties of constrained decoding on the tiny random-weight checkpoints.

* every output of a generated JSON schema parses and validates (hypothesis; the schemas are bounded so the
  grammar can complete within the token budget: enums, bounded integers, booleans, patterned strings, short
  arrays, nested objects);
* KV-sharing fast prefill on and off give the same constrained tokens.
"""

from __future__ import annotations

import json

import jsonschema
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers.engines import engine

LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.integers(-50, 50).map(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 20}),
    st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=4, unique=True).map(
        lambda vs: {"type": "string", "enum": vs}),
    st.just({"type": "string", "pattern": "^[a-z]{1,4}$"}),
    st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True).map(lambda vs: {"enum": vs}),
)


def _objects(children):
    return st.dictionaries(st.sampled_from(["a", "b", "cc", "d_1", "e"]), children, min_size=1, max_size=3).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props)})


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(_objects(children),
                               children.map(lambda c: {"type": "array", "items": c, "maxItems": 2})),
    max_leaves=4,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(schema=SCHEMAS, seed=st.integers(0, 2**20), greedy=st.booleans())
def test_every_constrained_output_validates(schema, seed, greedy):
    sp = {"json_schema": json.dumps(schema), "max_new_tokens": 96, "seed": seed,
          "temperature": 0.0 if greedy else 0.8}
    out = engine("e2b").generate("Describe it:", sp)
    assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out["text"])
    jsonschema.validate(json.loads(out["text"]), schema)


def _yoco(flag: bool):
    return engine("e2b", attention_backend="triton", decode_attention_backend="torch_native",
                  kv_sharing_fast_prefill=flag, disable_radix_cache=True)


def test_fast_prefill_on_equals_off_for_constrained_outputs():
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "yy", "z"]}, "v": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3}}, "required": ["k", "v"]}
    prompts = ["one two three four five six seven eight nine ten", "The quick brown fox", "x"]
    sps = [{"json_schema": json.dumps(schema), "max_new_tokens": 48, "temperature": 0},
           {"regex": r"[a-f]{2,5}-\d\d", "max_new_tokens": 24, "temperature": 0.9, "seed": 5},
           {"ebnf": 'root ::= "(" [0-9]+ ")"', "max_new_tokens": 24, "temperature": 0}]
    on, off = _yoco(True), _yoco(False)
    for sp in sps:
        a = [o["output_ids"] for o in on.generate(prompts, sp)]
        b = [o["output_ids"] for o in off.generate(prompts, sp)]
        assert a == b, sp
    assert on.work_counters()["fast_prefill_forwards"] >= 1
