"""Bounds on a request's grammar source, checked before anything is compiled.

A grammar is user input that costs compile time and memory: the source is
bounded in bytes, a JSON schema in nesting depth, node count and enum size,
a regex in its bounded repetitions (``a{100000}`` unrolls into that many
states), and compiling is bounded in time (``GrammarBackend``). Each refusal is
an ``InvalidGrammar`` naming the request field and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class InvalidGrammar(ValueError):
    """A grammar this server will not compile; ``field`` names the request field at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class GrammarLimits:
    max_source_bytes: int = 64 * 1024  # a JSON schema, regex or EBNF grammar as sent
    max_json_depth: int = 24  # nesting of schema objects / arrays
    max_json_nodes: int = 5000  # objects, arrays and values in the schema document
    max_enum_values: int = 1024  # entries of one enum
    max_regex_repeat: int = 1000  # n and m of a bounded repetition {n,m}
    compile_timeout_s: float = 10.0  # one compile (off the scheduler thread)


_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_source(kind: str, source: Any, field: str, lim: GrammarLimits) -> None:
    """Raise InvalidGrammar for a source over the limits (its type, bytes, and the per-kind checks)."""
    if not isinstance(source, str) or not source:
        raise InvalidGrammar(f"{field} must be a non-empty string, got {type(source).__name__}", field)
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > lim.max_source_bytes:
        raise InvalidGrammar(f"{field} has {size} bytes, over this server's limit of {lim.max_source_bytes}; "
                             "send a smaller grammar", field)
    if kind == "json_schema":
        check_json_schema(source, field, lim)
    elif kind == "regex":
        for m in _REPEAT.finditer(source):
            counts = [int(x) for x in m.groups() if x]
            if max(counts, default=0) > lim.max_regex_repeat:
                raise InvalidGrammar(f"{field} repeats {max(counts)} times at offset {m.start()} ({m.group(0)!r}); "
                                     f"bounded repetitions are limited to {lim.max_regex_repeat}", field)


def check_json_schema(source: str, field: str, lim: GrammarLimits) -> Any:
    """The parsed schema; refused when it is not JSON, not an object / boolean, or over the limits."""
    try:
        schema = json.loads(source)
    except (json.JSONDecodeError, RecursionError) as e:
        raise InvalidGrammar(f"{field} is not valid JSON: {e}", field) from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidGrammar(f"{field} must be a JSON Schema object, got {type(schema).__name__}", field)
    nodes = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:  # iterative: a hostile depth must not overflow Python's stack
        node, depth = stack.pop()
        nodes += 1
        if nodes > lim.max_json_nodes:
            raise InvalidGrammar(f"{field} has more than {lim.max_json_nodes} JSON values; send a smaller schema", field)
        if depth > lim.max_json_depth:
            raise InvalidGrammar(f"{field} nests deeper than {lim.max_json_depth} levels; flatten the schema", field)
        if isinstance(node, dict):
            enum = node.get("enum")
            if isinstance(enum, list) and len(enum) > lim.max_enum_values:
                raise InvalidGrammar(f"{field} has an enum of {len(enum)} values, over the limit of "
                                     f"{lim.max_enum_values}", field)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return schema
