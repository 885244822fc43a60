"""Gemma-4's function-calling format: values, declarations, calls, responses, and a parser for calls.

The model writes a call as ``<|tool_call>call:NAME{key:value,...}<tool_call|>``; a
value is a string between two ``<|"|>`` markers (no escapes: a string cannot
contain the marker), ``true`` / ``false`` / ``null``, a bare number, an object
``{key:value,...}`` with bare keys, or an array ``[value,...]``. Tool results go
back as ``<|tool_response>response:NAME{...}<tool_response|>`` and declarations as
``<|tool>declaration:NAME{description:...,parameters:{...}}<tool|>`` (the
published chat template renders them; ``render_*`` here are our fallback for a
template that does not know tools, e.g. the tiny checkpoints').
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

CALL_START, CALL_END = "<|tool_call>", "<tool_call|>"
RESPONSE_START, RESPONSE_END = "<|tool_response>", "<tool_response|>"
DECL_START, DECL_END = "<|tool>", "<tool|>"
QUOTE = '<|"|>'
MAX_PARSE_DEPTH = 64  # nesting a parsed argument value may have


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


# ---------------------------------------------------------------- rendering


def format_value(v: Any) -> str:
    if isinstance(v, str):
        return f"{QUOTE}{v}{QUOTE}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{format_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    return json.dumps(v)


def render_declaration(function: Mapping[str, Any]) -> str:
    body: dict[str, Any] = {}
    if function.get("description"):
        body["description"] = function["description"]
    if function.get("parameters") is not None:
        body["parameters"] = function["parameters"]
    return f"{DECL_START}declaration:{function['name']}{format_value(body)}{DECL_END}"


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{CALL_START}call:{name}{format_value(arguments)}{CALL_END}"


def render_response(name: str, content: str) -> str:
    try:
        value = json.loads(content)
    except ValueError:
        value = None
    body = value if isinstance(value, dict) else {"value": content}
    return f"{RESPONSE_START}response:{name}{format_value(body)}{RESPONSE_END}"


# ---------------------------------------------------------------- parsing

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_LITERAL_END = re.compile(r"[,}\]]")


class _Reader:
    def __init__(self, text: str):
        self.s, self.i = text, 0

    def peek(self, tok: str) -> bool:
        return self.s.startswith(tok, self.i)

    def expect(self, tok: str) -> None:
        if not self.peek(tok):
            raise ValueError(f"expected {tok!r} at {self.i}")
        self.i += len(tok)

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_PARSE_DEPTH:
            raise ValueError("arguments nest too deeply")
        if self.peek(QUOTE):
            self.i += len(QUOTE)
            end = self.s.find(QUOTE, self.i)
            if end < 0:
                raise ValueError("unterminated string")
            out, self.i = self.s[self.i : end], end + len(QUOTE)
            return out
        if self.peek("{"):
            return self.obj(depth)
        if self.peek("["):
            self.i += 1
            items: list[Any] = []
            while not self.peek("]"):
                items.append(self.value(depth + 1))
                if not self.peek("]"):
                    self.expect(",")
            self.i += 1
            return items
        m = _LITERAL_END.search(self.s, self.i)
        end = m.start() if m else len(self.s)
        raw, self.i = self.s[self.i : end].strip(), end
        if raw in ("true", "false", "null"):
            return json.loads(raw)
        try:
            return json.loads(raw)  # numbers (and a JSON-quoted string)
        except ValueError:
            return raw

    def key(self) -> str:
        if self.peek(QUOTE):
            k = self.value()
            return k if isinstance(k, str) else str(k)
        end = self.s.find(":", self.i)
        if end < 0:
            raise ValueError("expected a key")
        k, self.i = self.s[self.i : end].strip().strip('"'), end
        return k

    def obj(self, depth: int = 0) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        while not self.peek("}"):
            k = self.key()
            self.expect(":")
            out[k] = self.value(depth + 1)
            if not self.peek("}"):
                self.expect(",")
        self.i += 1
        return out


def parse_call(block: str) -> ParsedCall:
    """``call:NAME{...}`` (the text between the markers) -> the call; ValueError when it is not one."""
    r = _Reader(block.strip())
    r.expect("call:")
    m = _NAME.match(r.s, r.i)
    if m is None:
        raise ValueError("expected a function name")
    r.i = m.end()
    args = r.obj() if r.peek("{") else {}
    if r.s[r.i :].strip():
        raise ValueError(f"unexpected text after the arguments: {r.s[r.i:][:40]!r}")
    return ParsedCall(m.group(0), args)


def split_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """(the text outside complete call blocks, the calls parsed from them, in order). A block that does not
    parse stays in the text (the client sees what the model wrote)."""
    content: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        start = text.find(CALL_START, pos)
        end = text.find(CALL_END, start + len(CALL_START)) if start >= 0 else -1
        if start < 0 or end < 0:
            content.append(text[pos:])
            break
        try:
            calls.append(parse_call(text[start + len(CALL_START) : end]))
            content.append(text[pos:start])
        except ValueError:
            content.append(text[pos : end + len(CALL_END)])
        pos = end + len(CALL_END)
    return "".join(content), calls
