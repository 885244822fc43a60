"""Request intake: the one path from a caller's arguments to validated scheduler ``Req`` objects.

``expand_requests(input_ids, sampling_params, ...)`` is used by the offline
``Engine.generate``, by ``AsyncEngine.generate`` and by every HTTP route
(``impl/server/req_builder.py`` parses the body, then calls it):

* per-prompt arguments: a scalar applies to every prompt of the batch, a list
  (or tuple) must have one entry per prompt;
* ``n`` choices: ``B`` prompts with ``n`` choices become ``B * n`` requests,
  prompt-major; choice ``j`` of a seeded request gets seed ``seed + j`` (choices
  differ but stay reproducible); an unseeded request draws its seed from the
  engine's seed generator; the request id is ``rid`` when ``n == 1``, else
  ``f"{rid}-{j}"`` (a fresh uuid when no rid is given);
* validation, the only one on the request path (``validate_req``): every
  problem raises ``InvalidRequest``, a ``ValueError`` whose ``field`` names the
  argument at fault (``input_ids`` for the prompt itself), before anything is
  enqueued.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from impl.engine.req import Req
from impl.sampling.sampling_params import SamplingParams


class InvalidRequest(ValueError):
    """A request the engine can never serve; ``field`` names the argument at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class IntakeLimits:
    max_req_len: int  # prompt + output tokens one request may reach
    vocab_size: int | None


def validate_req(req: Req, limits: IntakeLimits) -> None:
    """Raise InvalidRequest for a request this engine can never serve."""
    n = len(req.origin_input_ids)
    if n == 0:
        raise InvalidRequest("the prompt is empty; pass a non-empty prompt or input_ids", "input_ids")
    if n >= limits.max_req_len:
        raise InvalidRequest(
            f"the prompt has {n} tokens, but this engine serves at most {limits.max_req_len - 1} prompt tokens "
            "(context length and KV pool size); shorten the prompt or raise --context-length / --max-total-tokens",
            "input_ids",
        )
    vs = limits.vocab_size
    if vs is not None and (min(req.origin_input_ids) < 0 or max(req.origin_input_ids) >= vs):
        raise InvalidRequest(f"input_ids must be token ids in [0, {vs}), got values outside that range", "input_ids")
    if req.return_logprob and req.logprob_start_len >= n:
        raise InvalidRequest(f"logprob_start_len={req.logprob_start_len} must be below the prompt length {n}",
                             "logprob_start_len")
    try:
        req.sampling_params.verify(vs)
    except ValueError as e:
        raise InvalidRequest(str(e), "sampling_params") from None


def per_prompt(value: Any, b: int, name: str) -> list[Any]:
    """One entry per prompt: a list must have ``b`` entries, anything else is repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != b:
            raise InvalidRequest(f"{name} has {len(value)} entries for a batch of {b} prompts", name)
        return list(value)
    return [value] * b


def _sampling(value: SamplingParams | dict | None) -> SamplingParams:
    try:
        return SamplingParams.from_dict(value)
    except (ValueError, TypeError) as e:
        raise InvalidRequest(str(e), "sampling_params") from None


def expand_requests(
    input_ids: Sequence[Sequence[int]],
    sampling_params: SamplingParams | dict | None | Sequence[SamplingParams | dict | None] = None,
    return_logprob: bool | Sequence[bool] = False,
    logprob_start_len: int | None | Sequence[int | None] = None,
    top_logprobs_num: int | None | Sequence[int | None] = None,
    rid: str | None | Sequence[str | None] = None,
    *,
    limits: IntakeLimits,
    seed_generator: torch.Generator,
) -> list[Req]:
    """A batch of prompts (token ids) -> validated Reqs, ``B * n`` of them, prompt-major."""
    b = len(input_ids)
    if b == 0:
        raise InvalidRequest("the batch is empty", "input_ids")
    sps = [_sampling(s) for s in per_prompt(sampling_params, b, "sampling_params")]
    rets = per_prompt(return_logprob, b, "return_logprob")
    starts = per_prompt(logprob_start_len, b, "logprob_start_len")
    tops = per_prompt(top_logprobs_num, b, "top_logprobs_num")
    rids = per_prompt(rid, b, "rid")
    for t in tops:
        if t is not None and t < 0:
            raise InvalidRequest(f"top_logprobs_num must be >= 0, got {t}", "top_logprobs_num")
    reqs = []
    for i in range(b):
        if len(input_ids[i]) == 0:  # before Req() reads the first prompt token
            raise InvalidRequest("the prompt is empty; pass a non-empty prompt or input_ids", "input_ids")
        base = rids[i] or uuid.uuid4().hex
        n = sps[i].n
        for j in range(n):
            sp = dataclasses.replace(sps[i], n=1, stop=list(sps[i].stop), stop_token_ids=list(sps[i].stop_token_ids))
            if sp.seed is not None:
                sp.seed += j
            seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=seed_generator))
            ret = bool(rets[i])
            start = -1 if starts[i] is None else int(starts[i])
            reqs.append(Req(
                rid=base if n == 1 else f"{base}-{j}",
                origin_input_ids=[int(t) for t in input_ids[i]],
                sampling_params=sp,
                return_logprob=ret,
                logprob_start_len=start if ret else -1,
                top_logprobs_num=int(tops[i] or 0) if ret else 0,
                generator=torch.Generator().manual_seed(seed),
            ))
    for r in reqs:
        validate_req(r, limits)
    return reqs
