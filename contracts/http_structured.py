"""Issue 34 (structured outputs): constrained decoding seen through HTTP (``needs={"http"}``).

The tiny checkpoints have random weights, so their unconstrained output is
noise: an output that parses and validates shows the grammar did the work.
The grammars here complete well within their token budgets (enums, bounded
integers, short repetitions), so every answer must finish with ``stop``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from contracts.base import contract, out_of_scope, require
from contracts.http_dialect import discover
from contracts.http_support import ARGV_OFF, ARGV_ON, model_name, post

SOURCE = "issue 34 (structured outputs and tool calling), items 1, 2 and 4"
SCHEMA = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Rome", "Oslo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    "required": ["city", "days", "flags"]}
REGEX = r"[a-f]{2,4}-[0-9]{2}"
EBNF = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'
PROMPTS = ["The forecast:", "one two three four five six seven eight", "Q"]


def _valid_json(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


CHECKS = {
    "json_schema": (json.dumps(SCHEMA), _valid_json),
    "regex": (REGEX, lambda t: re.fullmatch(REGEX, t) is not None),
    "ebnf": (EBNF, lambda t: re.fullmatch(r"\([0-9x](,[0-9x])*\)", t) is not None),
}


def _generate(url: str, kind: str, source: str) -> list[dict[str, Any]]:
    r = post(url, "/generate", {"text": PROMPTS, "sampling_params": {
        "temperature": 0, "max_new_tokens": 64, kind: source}})
    r.raise_for_status()
    return r.json()


@contract("HTTP-STRUCTURED-OUTPUT-VALID", SOURCE, rules=("H10", "F15"), needs=("http",))
def structured_output_valid(subject) -> None:
    # one launch at a time (a mutant subject runs one server at a time): the flag-off server first
    """On the tiny random-weight model, /generate with sampling_params json_schema, regex or ebnf (a batch, greedy)
    and a chat completion with response_format json_schema give outputs that parse and validate against their
    grammar and finish with 'stop'; the same requests give the same tokens with --kv-sharing-fast-prefill on and
    off; a grammar that cannot compile is a 400 naming its field."""
    off = subject.base_url(ARGV_OFF)
    if not discover(off).native:
        # the rule is about SGLang's native sampling_params json_schema / regex / ebnf on /generate (with the chat
        # leg beside them): an OpenAI-only server (vLLM) has no /generate to ask
        raise out_of_scope("/generate", "the server has no /generate (SGLang's native API), whose sampling_params "
                           "json_schema / regex / ebnf the rule is about")
    ids_off = {}
    for kind, (source, valid) in CHECKS.items():
        outs = _generate(off, kind, source)
        for i, o in enumerate(outs):
            require(valid(o["text"]), f"{kind}: prompt {i}'s output {o['text']!r} does not match {source!r}")
            require(o["meta_info"]["finish_reason"]["type"] == "stop",
                    f"{kind}: prompt {i} finished with {o['meta_info']['finish_reason']}, not 'stop' (the grammar "
                    "completes within 64 tokens)")
        ids_off[kind] = [o["output_ids"] for o in outs]
    chat = post(off, "/v1/chat/completions", {
        "model": model_name(off), "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 64,
        "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}})
    chat.raise_for_status()
    text = chat.json()["choices"][0]["message"]["content"]
    require(_valid_json(text), f"chat response_format json_schema: {text!r} does not validate against the schema")
    bad = post(off, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": "((("}})
    err = bad.json().get("error", {}) if bad.headers.get("content-type", "").startswith("application/json") else {}
    require(bad.status_code == 400 and "regex" in f"{err.get('param')} {err.get('message')}",
            f"a regex that cannot compile must be a 400 naming 'regex'; got {bad.status_code}: {bad.text[:200]}")
    on = subject.base_url(ARGV_ON)
    for kind, (source, _) in CHECKS.items():
        got = [o["output_ids"] for o in _generate(on, kind, source)]
        require(got == ids_off[kind], f"{kind}: fast prefill on gave {got}, off {ids_off[kind]}")
