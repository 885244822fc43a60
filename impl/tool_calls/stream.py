"""Streamed text -> content deltas and complete tool calls (Gemma-4's markers, ``gemma4.py``).

Text outside call blocks is passed on at once, except a tail that could be
the start of ``<|tool_call>`` (held until the next text decides); a call is
emitted whole when its ``<tool_call|>`` arrives (OpenAI clients accept a call's
name and arguments in one delta); a block that does not parse goes out as
content, as in the non-streamed answer (``gemma4.split_calls``).
"""

from __future__ import annotations

from impl.tool_calls.gemma4 import CALL_END, CALL_START, ParsedCall, parse_call


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolCallStream:
    def __init__(self) -> None:
        self.buf = ""
        self.in_call = False
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content to send now, calls completed by ``text``)."""
        self.buf += text
        content: list[str] = []
        calls: list[ParsedCall] = []
        while True:
            if not self.in_call:
                i = self.buf.find(CALL_START)
                if i < 0:
                    keep = _held_prefix(self.buf, CALL_START)
                    content.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    break
                content.append(self.buf[:i])
                self.buf, self.in_call = self.buf[i:], True
            j = self.buf.find(CALL_END)
            if j < 0:
                break
            block = self.buf[len(CALL_START) : j]
            try:
                calls.append(parse_call(block))
            except ValueError:
                content.append(self.buf[: j + len(CALL_END)])
            self.buf, self.in_call = self.buf[j + len(CALL_END) :], False
        self.num_calls += len(calls)
        return "".join(content), calls

    def flush(self) -> str:
        """What is held at the end of the output (an unfinished block goes out as content)."""
        rest, self.buf, self.in_call = self.buf, "", False
        return rest
