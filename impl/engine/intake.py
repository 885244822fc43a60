"""Request intake: the one path from a caller's arguments to validated scheduler ``Req`` objects.

``expand_requests(input_ids, sampling_params, ...)`` is used by the offline
``Engine.generate``, by ``AsyncEngine.generate`` and by every HTTP route
(``impl/server/req_builder.py`` maps the body's fields, then calls it). It is
the engine's only gate: everything semantic is checked here, once, before a
``Req`` exists, and nothing changes a ``Req`` after it was validated.

* per-prompt arguments: a scalar applies to every prompt of the batch, a list
  (or tuple) must have one entry per prompt;
* sampling params: parsed and verified once (``SamplingParams.from_dict`` with
  the vocabulary);
* the context (``IntakePolicy``): a prompt longer than ``max_req_len - 1`` tokens
  is refused, or keeps its first tokens under ``--allow-auto-truncate``; prompt +
  ``max_new_tokens`` over ``max_req_len`` is refused when the caller chose
  ``max_new_tokens`` (and not auto-truncating), else ``max_new_tokens`` is capped
  to the room left (SGLang's behaviour); texts are bounded before tokenizing
  (``IntakePolicy.check_text``);
* ``n`` choices: ``B`` prompts with ``n`` choices become ``B * n`` requests,
  prompt-major; choice ``j`` of a seeded request gets seed ``seed + j`` (choices
  differ but stay reproducible); an unseeded request draws its seed from the
  engine's seed generator; the request id is ``rid`` when ``n == 1``, else
  ``f"{rid}-{j}"`` (a fresh uuid when no rid is given).

Every problem raises ``InvalidRequest``, a ``ValueError`` whose ``field`` names
the argument at fault (``input_ids`` for the prompt itself; for the sampling
params also ``sampling_field``, the field inside them), before anything is
enqueued.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from impl.engine.req import Req
from impl.sampling.sampling_params import SamplingError, SamplingParams

logger = logging.getLogger("impl.engine")

# A text of C characters has at least C / max_token_chars tokens; normalizers may shrink a text a
# little, so texts are refused (or cut, under auto-truncate) only this far beyond the bound.
TEXT_BOUND_SLACK = 2


class InvalidRequest(ValueError):
    """A request the engine can never serve; ``field`` names the argument at fault and, when that is
    ``sampling_params``, ``sampling_field`` the field of it (None: the params as a whole)."""

    def __init__(self, message: str, field: str, sampling_field: str | None = None):
        super().__init__(message)
        self.field = field
        self.sampling_field = sampling_field


@dataclass(frozen=True)
class IntakePolicy:
    """What every request is fitted to (built by the engine from its resolved arguments)."""

    max_req_len: int  # prompt + output tokens one request may reach: min(context length, KV pool tokens)
    vocab_size: int | None = None
    allow_auto_truncate: bool = False  # --allow-auto-truncate: cut what does not fit instead of refusing it

    @property
    def max_prompt_len(self) -> int:
        return self.max_req_len - 1  # at least one token is generated

    def text_budget(self, max_token_chars: int) -> int:
        """Characters that can still hold ``max_req_len`` tokens."""
        return TEXT_BOUND_SLACK * max_token_chars * self.max_req_len

    def check_text(self, chars: int, max_token_chars: int) -> None:
        """Refuse, before tokenizing, a text that certainly has more tokens than the context holds."""
        if chars > self.text_budget(max_token_chars) and not self.allow_auto_truncate:
            raise InvalidRequest(
                f"the prompt has {chars} characters, at least {chars // max_token_chars} tokens, but the context "
                f"holds {self.max_req_len} tokens; shorten the prompt, or start the server with --allow-auto-truncate",
                "input_ids")

    def too_long(self, n: int) -> InvalidRequest:
        return InvalidRequest(
            f"the prompt has {n} tokens, but the context holds {self.max_req_len} (at most {self.max_prompt_len} "
            "prompt tokens plus 1 generated); shorten the prompt, raise --context-length / --max-total-tokens, or "
            "start the server with --allow-auto-truncate", "input_ids")

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """The prompt, cut to ``max_prompt_len`` under auto-truncate; ``too_long`` otherwise."""
        room = self.max_prompt_len
        if len(ids) <= room:
            return ids
        if not self.allow_auto_truncate:
            raise self.too_long(len(ids))
        logger.warning("prompt of %d tokens truncated to %d (--allow-auto-truncate)", len(ids), room)
        return ids[:room]

    def fit_new_tokens(self, sp: SamplingParams, prompt_len: int, explicit: bool) -> SamplingParams:
        """``sp`` with ``max_new_tokens`` fitted to the room the prompt leaves (a copy when capped)."""
        room = self.max_req_len - prompt_len
        if sp.max_new_tokens <= room:
            return sp
        if explicit and not self.allow_auto_truncate:
            raise InvalidRequest(
                f"{sp.max_new_tokens} new tokens plus the prompt's {prompt_len} tokens make "
                f"{prompt_len + sp.max_new_tokens}, over the context length {self.max_req_len}; ask for at most {room} "
                "new tokens, shorten the prompt, or start the server with --allow-auto-truncate", "max_new_tokens")
        return dataclasses.replace(sp, max_new_tokens=room, min_new_tokens=min(sp.min_new_tokens, room))


def validate_req(req: Req, policy: IntakePolicy) -> None:
    """Raise InvalidRequest for a request this engine can never serve (its prompt and logprob options)."""
    ids = req.origin_input_ids
    n = len(ids)
    if n == 0:
        raise InvalidRequest("the prompt is empty; pass a non-empty prompt or input_ids", "input_ids")
    if n > policy.max_prompt_len:
        raise policy.too_long(n)
    vs = policy.vocab_size
    if vs is not None and (min(ids) < 0 or max(ids) >= vs):
        raise InvalidRequest(f"input_ids must be token ids in [0, {vs}), got values outside that range", "input_ids")
    if req.return_logprob and req.logprob_start_len >= n:
        raise InvalidRequest(f"logprob_start_len={req.logprob_start_len} must be below the prompt length {n}",
                             "logprob_start_len")


def per_prompt(value: Any, b: int, name: str) -> list[Any]:
    """One entry per prompt: a list must have ``b`` entries, anything else is repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != b:
            raise InvalidRequest(f"{name} has {len(value)} entries for a batch of {b} prompts", name)
        return list(value)
    return [value] * b


def _sampling(value: SamplingParams | Mapping[str, Any] | None, policy: IntakePolicy,
              default_max_new_tokens: int | None) -> tuple[SamplingParams, bool]:
    """(parsed and verified params, whether the caller chose max_new_tokens)."""
    explicit = isinstance(value, SamplingParams) or (
        isinstance(value, Mapping) and value.get("max_new_tokens") is not None)
    if not explicit and default_max_new_tokens is not None and (value is None or isinstance(value, Mapping)):
        value = {**(value or {}), "max_new_tokens": default_max_new_tokens}
    try:
        return SamplingParams.from_dict(value, policy.vocab_size), explicit
    except (ValueError, TypeError) as e:
        raise InvalidRequest(str(e), "sampling_params", e.field if isinstance(e, SamplingError) else None) from None


def cache_namespace(salt: str | None) -> int:
    """The radix cache namespace of a cache salt: 0 without one, else 128 bits of its hash above every token id
    (a key token is ``token + namespace``), so salted prefixes never meet unsalted or other salts' ones."""
    if salt is None:
        return 0
    if not isinstance(salt, str) or not salt:
        raise InvalidRequest(f"cache_salt must be a non-empty string, got {salt!r:.100}", "cache_salt")
    return (int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=16).digest(), "little") + 1) << 32


def expand_requests(
    input_ids: Sequence[Sequence[int]],
    sampling_params: SamplingParams | dict | None | Sequence[SamplingParams | dict | None] = None,
    return_logprob: bool | Sequence[bool] = False,
    logprob_start_len: int | None | Sequence[int | None] = None,
    top_logprobs_num: int | None | Sequence[int | None] = None,
    rid: str | None | Sequence[str | None] = None,
    *,
    policy: IntakePolicy,
    seed_generator: torch.Generator,
    default_max_new_tokens: int | None = None,
    input_token_ranks: bool = False,
    cache_salt: str | None | Sequence[str | None] = None,
) -> list[Req]:
    """A batch of prompts (token ids) -> validated Reqs, ``B * n`` of them, prompt-major.

    ``default_max_new_tokens``: the route's default where the caller left ``max_new_tokens`` unset
    (None: ``SamplingParams``' 128); a default is capped to the context, never refused. ``input_token_ranks``: each
    prompt logprob entry also gets its rank in its row (``Req.input_token_ranks``; vLLM's prompt_logprobs).
    ``cache_salt`` (per prompt or one for all): the prefix cache shares a prompt's prefixes only with requests of the
    same salt (``cache_namespace``)."""
    b = len(input_ids)
    if b == 0:
        raise InvalidRequest("the batch is empty", "input_ids")
    parsed = [_sampling(s, policy, default_max_new_tokens) for s in per_prompt(sampling_params, b, "sampling_params")]
    rets = per_prompt(return_logprob, b, "return_logprob")
    starts = per_prompt(logprob_start_len, b, "logprob_start_len")
    tops = per_prompt(top_logprobs_num, b, "top_logprobs_num")
    rids = per_prompt(rid, b, "rid")
    salts = per_prompt(cache_salt, b, "cache_salt")
    for t in tops:
        if t is not None and t < 0:
            raise InvalidRequest(f"top_logprobs_num must be >= 0, got {t}", "top_logprobs_num")
    reqs = []
    for i in range(b):
        if len(input_ids[i]) == 0:  # before Req() reads the first prompt token
            raise InvalidRequest("the prompt is empty; pass a non-empty prompt or input_ids", "input_ids")
        prompt = policy.fit_prompt([int(t) for t in input_ids[i]])
        base_sp = policy.fit_new_tokens(parsed[i][0], len(prompt), parsed[i][1])
        base = rids[i] or uuid.uuid4().hex
        n = base_sp.n
        for j in range(n):
            sp = dataclasses.replace(base_sp, n=1, stop=list(base_sp.stop), stop_token_ids=list(base_sp.stop_token_ids))
            if sp.seed is not None:
                sp.seed += j
            seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=seed_generator))
            ret = bool(rets[i])
            start = -1 if starts[i] is None else int(starts[i])
            reqs.append(Req(
                rid=base if n == 1 else f"{base}-{j}",
                origin_input_ids=list(prompt),
                sampling_params=sp,
                return_logprob=ret,
                logprob_start_len=start if ret else -1,
                top_logprobs_num=int(tops[i] or 0) if ret else 0,
                input_token_ranks=[] if ret and start >= 0 and input_token_ranks else None,
                cache_namespace=cache_namespace(salts[i]),
                generator=torch.Generator().manual_seed(seed),
            ))
    for r in reqs:
        validate_req(r, policy)
    return reqs
