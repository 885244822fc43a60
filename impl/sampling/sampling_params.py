"""SamplingParams: SGLang's fields and validation messages (our own code).

Greedy is ``temperature == 0`` (or ``top_k == 1``). ``top_k == -1`` disables
top-k. ``seed`` gives the request its own random generator, so the same seed
gives the same tokens whatever else runs in the batch.

Constrained decoding (SGLang's fields): at most one of ``json_schema`` (a
JSON Schema document as a string), ``regex`` and ``ebnf``; the engine compiles
it (``impl/constrained/grammar.py``). ``logit_bias``: token id -> a bias in
[-100, 100] added to that token's logit before sampling (OpenAI's
semantics; at most ``MAX_LOGIT_BIAS`` entries).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

_EPS = 1e-6
MAX_LOGIT_BIAS = 1024  # entries of one request's logit_bias
LOGIT_BIAS_RANGE = 100.0


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
        known = {f.name for f in dataclasses.fields(cls)}
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
                raise ValueError(f"{name} must be a number, got {v!r}.")

        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            num(name)
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            num(name, (int,))
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}.")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}.")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}.")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be a list of non-negative token ids, got {self.stop_token_ids!r}.")
        if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be below the vocabulary size {vocab_size}, got {self.stop_token_ids}.")
        given = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"Only one of regex, json_schema, or ebnf can be set, got {given}.")
        for k in given:
            if not isinstance(getattr(self, k), str) or not getattr(self, k):
                raise ValueError(f"{k} must be a non-empty string.")
        if given and self.min_new_tokens > 0:
            # the grammar decides where the output ends: forcing tokens past its end leaves no allowed token
            raise ValueError(f"min_new_tokens cannot be combined with {given[0]} (the grammar decides where the output "
                             "ends); drop min_new_tokens or make the grammar require the length.")
        if self.logit_bias is not None:
            _verify_logit_bias(self.logit_bias, vocab_size)


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
        raise ValueError(f"logit_bias must be an object mapping token ids to biases, got {type(bias).__name__}.")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed.")
    for k, v in bias.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (vocab_size is not None and k >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else "non-negative integers"
            raise ValueError(f"logit_bias keys must be token ids in {bound}, got {k!r}.")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -LOGIT_BIAS_RANGE <= v <= LOGIT_BIAS_RANGE:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {v!r} for token {k}.")
