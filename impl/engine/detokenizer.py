"""Incremental, UTF-8-safe detokenization for streaming output.

Byte-level (and byte-fallback) tokenizers split a multi-byte character over
several tokens; decoding a prefix then ends in U+FFFD. ``IncrementalDetokenizer``
never emits such a partial character: it emits the stable text before a
trailing run of U+FFFD and holds the rest back until the character completes
(or ``finish()`` is called).

Each step decodes a short window, not the whole output: ids are split into
``[prefix_offset, read_offset)`` (already emitted, decoded again only as
context, so that tokenizers that strip a leading space on the first token
decode the same way) and ``[read_offset, end)`` (new). The window only moves
when the decoded text ends on a complete character, so windows meet at
character boundaries and the concatenation of all deltas plus ``finish()``
equals ``tokenizer.decode(output_ids)`` when no ``prompt_ids`` are given.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"
# how many prompt ids to keep as decoding context for the first output token
PROMPT_CONTEXT_TOKENS = 5


class _Decoder(Protocol):
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas.

    ``prompt_ids``: the last few become decoding context (never emitted), so
    the first output token decodes as it would after the prompt.
    """

    def __init__(self, tokenizer: _Decoder, prompt_ids: Sequence[int] | None = None, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        context = [int(i) for i in (prompt_ids or [])][-PROMPT_CONTEXT_TOKENS:]
        self._ids: list[int] = context  # context ids followed by output ids
        self._num_context = len(context)
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._held_emitted = 0  # chars of the current window already emitted while a char was pending
        self.text = ""  # cumulative emitted text

    @property
    def output_ids(self) -> list[int]:
        return self._ids[self._num_context :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def step(self, new_ids: Iterable[int]) -> str:
        """Append ``new_ids``; return only the newly completed text (maybe "")."""
        self._ids.extend(int(i) for i in new_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        start = len(prefix_text) + self._held_emitted
        if window_text.endswith(REPLACEMENT_CHAR):
            # a character is still incomplete: emit the stable text before it, keep the window
            stable = window_text.rstrip(REPLACEMENT_CHAR)
            delta = stable[start:] if len(stable) > start else ""
            self._held_emitted += len(delta)
        else:
            delta = window_text[start:]
            self._advance()
        self.text += delta
        return delta

    def finish(self) -> str:
        """Emit whatever is held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        delta = window_text[len(prefix_text) + self._held_emitted :]
        self._advance()
        self.text += delta
        return delta

    def _advance(self) -> None:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._held_emitted = 0
