"""Chat messages with tools -> what the chat template renders.

A template that knows tools (it reads ``tools``, as Gemma-4's published one
does) gets the declarations as ``tools`` and the messages as sent (assistant
``tool_calls`` with their arguments as objects, ``role: "tool"`` messages). A
template that does not (the tiny checkpoints' Gemma-style one) gets the same
information in Gemma-4's own syntax (``gemma4.py``): the declarations at the
start of the system message, each assistant call after its content, and each
tool result after the call it answers, inside the model's turn.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from impl.tool_calls.gemma4 import render_call, render_declaration, render_response


def template_knows_tools(source: str | None) -> bool:
    return bool(source) and "tools" in source  # type: ignore[operator]


def _arguments(raw: Any) -> dict[str, Any]:
    """An assistant call's arguments: OpenAI sends a JSON string; templates want an object."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        raise ValueError("an assistant tool_calls entry has 'arguments' that are not a JSON object; send the JSON "
                         "text the server returned") from None
    if not isinstance(value, dict):
        raise ValueError("an assistant tool_calls entry has 'arguments' that are not a JSON object")
    return value


def prepare_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                     template_source: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages for the template, extra template variables). ``tools``: OpenAI tool dicts (may be empty). OpenAI's
    ``developer`` role (its newer name for system instructions) reaches the template as ``system``, the role Gemma's
    templates know."""
    msgs = [{**m, "role": "system"} if m.get("role") == "developer" else dict(m) for m in messages]
    for m in msgs:
        for call in m.get("tool_calls") or []:
            call["function"] = {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}
    if template_knows_tools(template_source):
        return msgs, ({"tools": [dict(t) for t in tools]} if tools else {})
    return _inline(msgs, tools), {}


def _text(m: Mapping[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "\n".join(p.get("text", "") for p in c if isinstance(p, Mapping))
    return c or ""


def _inline(msgs: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools, calls and results written into plain user / assistant / system messages."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for m in msgs:
        role = m["role"]
        if role == "assistant" and m.get("tool_calls"):
            calls = "".join(render_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            for c in m["tool_calls"]:
                if c.get("id"):
                    names[c["id"]] = c["function"]["name"]
            out.append({"role": "assistant", "content": _text(m) + calls})
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id") or "", "tool")
            rendered = render_response(name, _text(m))
            if out and out[-1]["role"] == "assistant":
                out[-1] = {**out[-1], "content": _text(out[-1]) + rendered}  # (its content may be absent or parts)
            else:
                out.append({"role": "user", "content": rendered})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    if tools:
        decls = "".join(render_declaration(t["function"]) for t in tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "role": "system", "content": decls + "\n" + _text(out[0])}
        else:
            out.insert(0, {"role": "system", "content": decls})
    return out
