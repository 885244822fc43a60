"""The EBNF that forces a Gemma-4 tool call (``tool_choice``: ``required``, or a named function).

``root`` is one call (``parallel_tool_calls`` false) or one or more calls, each
``<|tool_call>call:NAME{args}<tool_call|>`` for a declared NAME; the arguments
follow the function's ``parameters`` schema in Gemma-4's value syntax
(``gemma4.py``): required properties in declared order, then each optional one
at most once, in order; strings are ``<|"|>...<|"|>`` (without ``<``, since the
format has no escapes); integers and numbers are bounded in digits; ``enum`` /
``const`` are their literals; ``anyOf`` / ``oneOf`` their alternatives;
anything else (or no schema) is any Gemma-4 value. The grammar text is
compiled like any request's ``ebnf`` (bounded, cached by source).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from impl.tool_calls.gemma4 import CALL_END, CALL_START, QUOTE, format_value

GENERIC_RULES = f"""
g_value ::= g_str | g_num | "true" | "false" | "null" | g_obj | g_arr
g_str ::= {json.dumps(QUOTE)} [^<]* {json.dumps(QUOTE)}
g_int ::= "-"? ("0" | [1-9] [0-9]{{0,15}})
g_num ::= g_int ("." [0-9]{{1,16}})?
g_key ::= [A-Za-z_] [A-Za-z0-9_]{{0,63}}
g_obj ::= "{{" (g_key ":" g_value ("," g_key ":" g_value)*)? "}}"
g_arr ::= "[" (g_value ("," g_value)*)? "]"
"""

MAX_SCHEMA_DEPTH = 16


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


class _Builder:
    def __init__(self) -> None:
        self.rules: list[str] = []
        self.n = 0

    def rule(self, body: str) -> str:
        name = f"r{self.n}"
        self.n += 1
        self.rules.append(f"{name} ::= {body}")
        return name

    def value(self, schema: Any, depth: int = 0) -> str:
        if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return "g_value"
        if "const" in schema:
            return self.rule(_lit(format_value(schema["const"])))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.rule(" | ".join(_lit(format_value(v)) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.rule(" | ".join(self.value(s, depth + 1) for s in schema[key]))
        t = schema.get("type")
        if isinstance(t, list) and t:
            return self.rule(" | ".join(self.value({**schema, "type": x}, depth + 1) for x in t))
        if t == "string":
            return "g_str"
        if t == "integer":
            return "g_int"
        if t == "number":
            return "g_num"
        if t == "boolean":
            return self.rule('"true" | "false"')
        if t == "null":
            return self.rule('"null"')
        if t == "array":
            item = self.value(schema.get("items"), depth + 1)
            return self.rule(f'"[" ({item} ("," {item})*)? "]"')
        if t == "object" or "properties" in schema:
            return self.rule(f'"{{" {self.args(schema, depth + 1)} "}}"')
        return "g_value"

    def args(self, schema: Any, depth: int = 0) -> str:
        """The inside of an object's braces (a rule name, or "" for no arguments)."""
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(props, Mapping) or not props:
            # no declared properties: no arguments, unless the schema allows any (additionalProperties)
            if isinstance(schema, Mapping) and schema.get("additionalProperties") not in (None, False):
                return self.rule('(g_key ":" g_value ("," g_key ":" g_value)*)?')
            return '""'
        required = [k for k in (schema.get("required") or []) if k in props]
        optional = [k for k in props if k not in required]
        pairs = {k: f'{_lit(str(k) + ":")} {self.value(props[k], depth + 1)}' for k in props}
        if required:
            body = ' "," '.join(pairs[k] for k in required)
            body += "".join(f' ("," {pairs[k]})?' for k in optional)
            return self.rule(body)
        # no required property: any in-order subset of the optional ones (tails[i]: what may follow key i)
        tails = [""] * len(optional)
        for i in reversed(range(len(optional))):
            later = [f'"," {pairs[k]} {tails[j]}'.strip() for j, k in enumerate(optional) if j > i]
            tails[i] = self.rule(" | ".join(['""', *later])) if later else ""
        firsts = [f"{pairs[k]} {tails[i]}".strip() for i, k in enumerate(optional)]
        return self.rule(" | ".join(['""', *firsts]))


def forced_call_grammar(tools: Sequence[Mapping[str, Any]], name: str | None = None, parallel: bool = True) -> str:
    """EBNF for a forced call of ``name`` (None: any declared function). ``tools``: OpenAI tool dicts."""
    b = _Builder()
    alts = []
    for tool in tools:
        fn = tool["function"]
        if name is not None and fn["name"] != name:
            continue
        args = b.args(fn.get("parameters") or {})
        alts.append(f'{_lit(fn["name"])} "{{" {args} "}}"')
    call = f'{_lit(CALL_START + "call:")} ({" | ".join(alts)}) {_lit(CALL_END)}'
    root = "call+" if parallel else "call"
    return "\n".join([f"root ::= {root}", f"call ::= {call}", *b.rules]) + GENERIC_RULES
