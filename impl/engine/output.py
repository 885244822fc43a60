"""Typed request outputs: ``ReqOutput`` (one emission of one request) and its SGLang dict.

The detokenizer stage (``impl/engine/detokenizer_stage.py``) builds one
``ReqOutput`` per emission: every ``stream_interval`` tokens of a streamed
request, and once when a request finishes. Fields:

* ``text``: the cumulative *stable* text: a partial UTF-8 character and a
  trailing prefix of a stop string are held back until they resolve, so each
  ``text`` is a prefix of the next and of the final one; the final text is
  stop-trimmed (unless ``no_stop_trim``). ``text_delta``: what this emission
  adds to the previous one's ``text``.
* ``output_ids``: cumulative; ``finish_reason``: None until the last emission.
* usage (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``), timing
  (``ttft``, ``e2e_latency``, seconds since the request was created), logprobs
  (``Logprobs`` when the request asked for them), and room for speculative
  decoding stats (``spec_verify_ct``, ``spec_accept_length``; 0 / None without it).

``to_sglang()`` gives SGLang's ``{"text", "output_ids", "meta_info"}`` dict
(the offline ``Engine.generate`` result and the ``/generate`` body); the
OpenAI routes format the same object (``impl/server/openai_api.py``).
Logprob entries in the dict use SGLang's tuple format ``(logprob, token_id, None)``
(the third slot is the token text, filled only with ``return_text_in_logprobs``,
which this engine does not offer). ``input_token_logprobs`` runs over prompt
tokens ``logprob_start_len ..``; its first entry is ``(None, id, None)`` when
``logprob_start_len == 0``. Without prompt logprobs the input lists are empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from impl.engine.req import FinishReason

LogprobPair = tuple[float | None, int]  # (logprob, token id)
TopEntry = list[tuple[float, int]] | None  # top-k (logprob, token id) of one position


@dataclass(frozen=True)
class Logprobs:
    input_token_logprobs: list[LogprobPair]
    output_token_logprobs: list[LogprobPair]
    input_top_logprobs: list[TopEntry]
    output_top_logprobs: list[TopEntry]
    top_logprobs_num: int


@dataclass(frozen=True)
class ReqOutput:
    rid: str
    text: str
    text_delta: str
    output_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float
    ttft: float | None = None
    logprobs: Logprobs | None = None
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

    def to_sglang(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": None if self.finish_reason is None else self.finish_reason.to_json(),
            "e2e_latency": self.e2e_latency,
        }
        if self.ttft is not None:
            meta["ttft"] = self.ttft
        lp = self.logprobs
        if lp is not None:
            meta.update(
                input_token_logprobs=_triples(lp.input_token_logprobs),
                output_token_logprobs=_triples(lp.output_token_logprobs),
                input_top_logprobs=_top(lp.input_top_logprobs) if lp.top_logprobs_num else [],
                output_top_logprobs=_top(lp.output_top_logprobs) if lp.top_logprobs_num else [],
            )
        if self.spec_verify_ct:
            meta.update(spec_verify_ct=self.spec_verify_ct, spec_accept_length=self.spec_accept_length)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def _triples(pairs: list[LogprobPair]) -> list[tuple[float | None, int, None]]:
    return [(lp, tok, None) for lp, tok in pairs]


def _top(entries: list[TopEntry]) -> list[list[tuple[float, int, None]] | None]:
    return [None if e is None else _triples(e) for e in entries]  # type: ignore[arg-type]
