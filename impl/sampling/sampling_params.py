"""SamplingParams: SGLang's fields and validation messages (our own code).

Greedy is ``temperature == 0`` (or ``top_k == 1``). ``top_k == -1`` disables
top-k. ``seed`` gives the request its own random generator, so the same seed
gives the same tokens whatever else runs in the batch.

Constrained decoding (SGLang's fields): at most one of ``json_schema`` (a
JSON Schema document as a string), ``regex`` and ``ebnf``; the engine compiles
it (``impl/constrained/grammar.py``). ``logit_bias``: token id -> a bias in
[-100, 100] added to that token's logit before sampling (OpenAI's
semantics; at most ``MAX_LOGIT_BIAS`` entries). vLLM's ``allowed_token_ids``
(only these tokens may be sampled) and ``bad_words_token_ids`` (the token
sequences of its ``bad_words``, which the server tokenizes: a sequence's last
token is banned where the output ends with the rest; at most ``MAX_BAD_WORDS``
sequences of ``MAX_BAD_WORD_TOKENS`` tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

_EPS = 1e-6
MAX_LOGIT_BIAS = 1024  # entries of one request's logit_bias
MAX_BAD_WORDS = 256  # token sequences of one request's bad words (up to two per word: without and with a space)
MAX_BAD_WORD_TOKENS = 64
LOGIT_BIAS_RANGE = 100.0


@dataclass(frozen=True)
class Range:
    """The values a float sampling field accepts: ``lo <= v`` (``lo < v`` when ``lo_open``) and ``v <= hi``."""

    lo: float
    hi: float | None = None  # None: no upper bound
    lo_open: bool = False

    def __contains__(self, v: float) -> bool:
        if self.hi is None:  # a lower bound only: refused is what falls below it (as SGLang checks temperature)
            return not (v <= self.lo if self.lo_open else v < self.lo)
        return (v > self.lo if self.lo_open else v >= self.lo) and v <= self.hi

    def describe(self) -> str:
        """The range in words, as SGLang's messages say it: ``non-negative``, ``in (0, 1]``."""
        if self.hi is None:
            return "positive" if self.lo == 0 and self.lo_open else "non-negative" if self.lo == 0 else f"at least {self.lo}"
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"

    def bounds(self) -> dict[str, float]:
        """The range as pydantic ``Field`` bounds (the HTTP body models, ``impl/server/protocol.py``)."""
        out = {"gt" if self.lo_open else "ge": self.lo}
        if self.hi is not None:
            out["le"] = self.hi
        return out


# The one statement of the float sampling fields' ranges: ``SamplingParams.verify`` checks them and the HTTP body
# models publish them (OpenAPI) and check them first.
SAMPLING_RANGES: dict[str, Range] = {
    "temperature": Range(0),
    "top_p": Range(0, 1, lo_open=True),
    "min_p": Range(0, 1),
    "frequency_penalty": Range(-2, 2),
    "presence_penalty": Range(-2, 2),
    "repetition_penalty": Range(0, 2, lo_open=True),
}


class SamplingError(ValueError):
    """A refusal of one sampling field, ``field`` (SGLang's message, which opens with the field's name)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    # allowed_token_ids as an index tensor, built on first use (not a field a caller sets; not copied by replace)
    _allowed_index: Any = field(default=None, init=False, repr=False, compare=False)

    def allowed_index(self) -> Any:
        """``allowed_token_ids`` as an int64 tensor (built once per request)."""
        if self._allowed_index is None:
            import torch

            self._allowed_index = torch.tensor(sorted(set(self.allowed_token_ids or ())), dtype=torch.int64)
        return self._allowed_index

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | "SamplingParams" | None, vocab_size: int | None = None) -> "SamplingParams":
        """Parse (a copy of) ``d`` and verify it (``verify``: ValueError naming the field)."""
        if d is None:
            return cls()
        if isinstance(d, SamplingParams):
            p = dataclasses.replace(d)
            p.verify(vocab_size)
            return p
        if not isinstance(d, Mapping):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        d = dict(d)
        if "sampling_seed" in d and "seed" not in d:  # SGLang's newer name
            d["seed"] = d.pop("sampling_seed")
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"sampling_params has unknown field(s) {unknown}; known fields: {sorted(known)}")
        d = {k: v for k, v in d.items() if v is not None or k == "seed"}
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        if isinstance(d.get("logit_bias"), Mapping):
            d["logit_bias"] = _token_bias(d["logit_bias"])
        if isinstance(d.get("stop_token_ids"), int):
            d["stop_token_ids"] = [d["stop_token_ids"]]
        p = cls(**d)
        p.verify(vocab_size)
        return p

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, source) of the request's constraint, or None."""
        for kind in ("json_schema", "regex", "ebnf"):
            v = getattr(self, kind)
            if v is not None:
                return kind, v
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _EPS or self.top_k == 1

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the offending field (SGLang's messages)."""
        def num(name: str, kinds: tuple[type, ...] = (int, float)) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, kinds):
                raise SamplingError(name, f"{name} must be a number, got {v!r}.")

        for name in SAMPLING_RANGES:
            num(name)
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            num(name, (int,))

        def in_range(name: str) -> None:
            v, r = getattr(self, name), SAMPLING_RANGES[name]
            if v not in r:
                raise SamplingError(name, f"{name} must be {r.describe()}, got {v}.")

        for name in ("temperature", "top_p", "min_p"):
            in_range(name)
        if self.top_k < 1 and self.top_k != -1:
            raise SamplingError("top_k", f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            in_range(name)
        if self.max_new_tokens < 0:
            raise SamplingError("max_new_tokens", f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise SamplingError("min_new_tokens", f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.n < 1:
            raise SamplingError("n", f"n must be at least 1, got {self.n}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise SamplingError("seed", f"seed must be an integer, got {self.seed!r}.")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingError("stop", f"stop must be a string or a list of non-empty strings, got {self.stop!r}.")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise SamplingError("stop_token_ids", f"stop_token_ids must be a list of non-negative token ids, got {self.stop_token_ids!r}.")
        if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
            raise SamplingError("stop_token_ids", f"stop_token_ids must be below the vocabulary size {vocab_size}, got {self.stop_token_ids}.")
        given = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"Only one of regex, json_schema, or ebnf can be set, got {given}.")
        for k in given:
            if not isinstance(getattr(self, k), str) or not getattr(self, k):
                raise SamplingError(k, f"{k} must be a non-empty string.")
        if given and self.min_new_tokens > 0:
            # the grammar decides where the output ends: forcing tokens past its end leaves no allowed token
            raise SamplingError("min_new_tokens", f"min_new_tokens cannot be combined with {given[0]} (the grammar decides where the output "
                             "ends); drop min_new_tokens or make the grammar require the length.")
        if self.logit_bias is not None:
            _verify_logit_bias(self.logit_bias, vocab_size)
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, list) or not ids or not _token_ids(ids, vocab_size):
                raise SamplingError("allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids"
                                    f"{_below(vocab_size)}, got {ids!r:.200}.")
        if self.bad_words_token_ids is not None:
            seqs = self.bad_words_token_ids
            if not isinstance(seqs, list) or len(seqs) > MAX_BAD_WORDS or not all(
                    isinstance(q, list) and 0 < len(q) <= MAX_BAD_WORD_TOKENS and _token_ids(q, vocab_size) for q in seqs):
                raise SamplingError("bad_words", f"bad words must be at most {MAX_BAD_WORDS} token sequences of 1 to "
                                    f"{MAX_BAD_WORD_TOKENS} token ids{_below(vocab_size)}, got {seqs!r:.200}.")


def _token_ids(ids: list[Any], vocab_size: int | None) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (vocab_size or 2**31) for t in ids)


def _below(vocab_size: int | None) -> str:
    return "" if vocab_size is None else f" below the vocabulary size {vocab_size}"


def _token_bias(d: Mapping[Any, Any]) -> dict[Any, Any]:
    """OpenAI / SGLang send token ids as JSON object keys (strings): ``{"42": -100}`` -> ``{42: -100}``."""
    out: dict[Any, Any] = {}
    for k, v in d.items():
        if isinstance(k, str) and k.strip().lstrip("-").isdigit() and len(k) <= 12:
            k = int(k)
        out[k] = v
    return out


def _verify_logit_bias(bias: Any, vocab_size: int | None) -> None:
    if not isinstance(bias, dict):
        raise SamplingError("logit_bias", f"logit_bias must be an object mapping token ids to biases, got {type(bias).__name__}.")
    if len(bias) > MAX_LOGIT_BIAS:
        raise SamplingError("logit_bias", f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed.")
    for k, v in bias.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (vocab_size is not None and k >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else "non-negative integers"
            raise SamplingError("logit_bias", f"logit_bias keys must be token ids in {bound}, got {k!r}.")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -LOGIT_BIAS_RANGE <= v <= LOGIT_BIAS_RANGE:
            raise SamplingError("logit_bias", f"logit_bias values must be numbers in [-100, 100], got {v!r} for token {k}.")
