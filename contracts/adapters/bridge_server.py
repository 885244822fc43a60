"""What both bridges run in their engine's own environment (``sglang_bridge.py``, ``vllm_bridge.py``): requests as
JSON lines on stdin, one JSON answer a line on the process's real stdout, everything the engine prints on stderr.
Standard library only (it runs beside the engine, not in the project's environment)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Callable, Mapping, TextIO


def take_stdout() -> TextIO:
    """The process's stdout, for the answers alone; from now on every print and warning goes to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def error_answer(e: BaseException, message: str | None = None, bases: list[str] | None = None) -> dict[str, Any]:
    """An exception as the adapters rebuild it: its type, its builtin bases, its message and where it was raised."""
    return {"type": type(e).__name__,
            "bases": bases if bases is not None else [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"],
            "message": str(e) if message is None else message,
            "where": "".join(traceback.format_exception(e)[-3:])[-1500:]}


def parse_answer(record: Any, refused: str | None, fields: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The answer to a "parse" request: the parser's refusal, or the parsed record's fields."""
    if refused is not None:
        return {"refused": refused}
    return {"args": fields(record)}


def serve(out: TextIO, version: str, ops: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]],
          error: Callable[[BaseException], dict[str, Any]]) -> int:
    """Say ready (with the engine's version), then answer each request line with ``ops[req["op"]](req)``; a failure
    of the bridge itself is answered as ``{"bridge_error": error(e)}`` (not a verdict)."""
    out.write(json.dumps({"ready": True, "version": version}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            answer = ops[req["op"]](req)
        except Exception as e:  # noqa: BLE001 - a bridge failure, reported as such (not a verdict)
            answer = {"bridge_error": error(e)}
        out.write(json.dumps(answer) + "\n")
    return 0
