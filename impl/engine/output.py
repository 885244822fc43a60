"""Typed request outputs: ``ReqOutput`` (one emission of one request, what is new in it) and SGLang's dicts.

The detokenizer stage (``impl/engine/detokenizer_stage.py``) builds one
``ReqOutput`` per emission: every ``stream_interval`` tokens of a streamed
request, and once when a request finishes. An emission carries what is new
since the request's previous one, so a stream of ``n`` tokens copies ``O(n)``
entries in all, not ``O(n^2)``. Fields:

* ``text``: the cumulative *stable* text (a reference, not a copy): a partial
  UTF-8 character and a trailing prefix of a stop string are held back until
  they resolve, so each ``text`` is a prefix of the next and of the final one;
  the final text is stop-trimmed (unless ``no_stop_trim``). ``text_delta``: what
  this emission adds to the previous one's ``text``.
* ``output_ids_delta``: the output ids new in this emission (all of them in a
  non-streamed request's only emission); ``completion_tokens`` counts every
  output id so far; ``finish_reason``: None until the last emission.
* usage (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``), timing
  (``ttft``, ``e2e_latency``, seconds since the request was created),
  ``logprobs_delta`` (``Logprobs``, the entries new in this emission, when the
  request asked for them), and room for speculative decoding stats
  (``spec_verify_ct``, ``spec_accept_length``; 0 / None without it).

``SGLangDicts`` turns one request's outputs, in order, into SGLang's
``{"text", "output_ids", "meta_info"}`` dicts: text and ``output_ids``
cumulative (SGLang's format), logprobs cumulative or (``incremental_logprobs``,
the ``/generate`` stream) only the new entries. ``sglang_dict(out)`` is the dict
of a request's only emission (the offline ``Engine.generate`` result and the
``/generate`` body). The OpenAI routes format the deltas directly
(``impl/server/openai_api.py``). Logprob entries in the dicts use SGLang's tuple
format ``(logprob, token_id, text)``: the third slot is the token's text (special
tokens included, ``TokenText``) with SGLang's ``return_text_in_logprobs``, else None.
``input_token_logprobs`` runs over prompt tokens ``logprob_start_len ..``; its
first entry is ``(None, id, None)`` when ``logprob_start_len == 0``. Without
prompt logprobs the input lists are empty. ``Logprobs.input_token_ranks`` (None
unless the request asked: vLLM's ``prompt_logprobs``) gives each input entry's
rank in its row (1: the most likely), None where its logprob is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from impl.engine.req import FinishReason

LogprobPair = tuple[float | None, int]  # (logprob, token id)
TopEntry = list[tuple[float, int]] | None  # top-k (logprob, token id) of one position


@dataclass(frozen=True)
class Logprobs:
    """Logprob entries of one emission: those new since the request's previous emission."""

    input_token_logprobs: list[LogprobPair]
    output_token_logprobs: list[tuple[float, int]]  # an output token always has its logprob
    input_top_logprobs: list[TopEntry]
    output_top_logprobs: list[TopEntry]
    top_logprobs_num: int
    input_token_ranks: list[int | None] | None = None  # each input entry's rank in its row, when asked


@dataclass(frozen=True)
class ReqOutput:
    rid: str
    text: str
    text_delta: str
    output_ids_delta: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float
    ttft: float | None = None
    logprobs_delta: Logprobs | None = None
    spec_verify_ct: int = 0  # speculative verify forwards (0: no speculative decoding)
    spec_accept_length: float | None = None  # mean accepted tokens per verify forward

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def finish_type(self) -> str | None:
        """"stop" | "length" | "abort", None while running (OpenAI's ``finish_reason``)."""
        return None if self.finish_reason is None else self.finish_reason.type

    @property
    def matched_stop(self) -> int | str | None:
        """The stop token id or string that ended the request (None otherwise)."""
        fr = self.finish_reason
        return fr.matched if fr is not None and fr.type == "stop" else None

    @property
    def output_start(self) -> int:
        """Output ids before this emission's delta."""
        return self.completion_tokens - len(self.output_ids_delta)


class TokenText:
    """Token id -> its text (special tokens included), cached: the text of a logprob entry. ``label`` names a
    token in a logprob entry: its text, or with ``as_ids`` (vLLM's return_tokens_as_token_ids) ``"token_id:N"``."""

    def __init__(self, decode: Callable[[list[int], bool], str], as_ids: bool = False):
        self.decode = decode
        self.as_ids = as_ids
        self.cache: dict[int, str] = {}

    def label(self, tok: int) -> str:
        return f"token_id:{tok}" if self.as_ids else self(tok)

    def __call__(self, tok: int) -> str:
        s = self.cache.get(tok)
        if s is None:
            s = self.cache[tok] = self.decode([tok], False)
        return s


class SGLangDicts:
    """SGLang's dicts of one request's outputs, fed in emission order; with ``token_text`` (SGLang's
    ``return_text_in_logprobs``) each logprob entry carries its token's text."""

    def __init__(self, incremental_logprobs: bool = False, token_text: TokenText | None = None):
        self.incremental_logprobs = incremental_logprobs
        self.token_text = token_text
        self.output_ids: list[int] = []
        self._logprobs: tuple[list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [])

    def add(self, out: ReqOutput) -> dict[str, Any]:
        assert out.output_start == len(self.output_ids), "outputs of one request must be added in order"
        self.output_ids.extend(out.output_ids_delta)
        meta: dict[str, Any] = {
            "id": out.rid,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "finish_reason": None if out.finish_reason is None else out.finish_reason.to_json(),
            "e2e_latency": out.e2e_latency,
        }
        if out.ttft is not None:
            meta["ttft"] = out.ttft
        lp = out.logprobs_delta
        if lp is not None:
            new: tuple[list[Any], list[Any], list[Any], list[Any]] = (
                lp.input_token_logprobs, lp.output_token_logprobs, lp.input_top_logprobs, lp.output_top_logprobs)
            if not self.incremental_logprobs:
                for acc, entries in zip(self._logprobs, new):
                    acc.extend(entries)
                new = self._logprobs
            inp, outp, inp_top, out_top = new
            tt = self.token_text
            meta.update(
                input_token_logprobs=_triples(inp, tt),
                output_token_logprobs=_triples(outp, tt),
                input_top_logprobs=_top(inp_top, tt) if lp.top_logprobs_num else [],
                output_top_logprobs=_top(out_top, tt) if lp.top_logprobs_num else [],
            )
        if out.spec_verify_ct:
            meta.update(spec_verify_ct=out.spec_verify_ct, spec_accept_length=out.spec_accept_length)
        return {"text": out.text, "output_ids": list(self.output_ids), "meta_info": meta}


def sglang_dict(out: ReqOutput, token_text: TokenText | None = None) -> dict[str, Any]:
    """The SGLang dict of a request's only emission (a non-streamed request's final output)."""
    return SGLangDicts(token_text=token_text).add(out)


def _triples(pairs: list[LogprobPair], tt: TokenText | None) -> list[tuple[float | None, int, str | None]]:
    return [(lp, tok, None if tt is None else tt(tok)) for lp, tok in pairs]


def _top(entries: list[TopEntry], tt: TokenText | None) -> list[list[tuple[float, int, str | None]] | None]:
    return [None if e is None else [(lp, tok, None if tt is None else tt(tok)) for lp, tok in e] for e in entries]
