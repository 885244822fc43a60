"""HTTP request bodies -> validated engine ``Req`` objects.

It runs on the HTTP intake thread pool (``impl/server/intake.py``), never on
the event loop, and only parses: it tokenizes, maps each API's fields onto sampling
params and logprob options, then hands the batch to ``Engine.expand_requests``
(``impl/engine/intake.py``: batch x ``n``, the ``seed + j`` rule, the one
validation). Every problem is an ``APIError(400)`` naming the field; the
engine's refusals about the prompt name the prompt's field (``text``,
``input_ids``, ``prompt``, ``messages``). Prompts and ``max_new_tokens`` are
fitted to the context by ``intake.fit_prompt`` / ``intake.check_context``
(a 400 naming both numbers, or truncation under ``--allow-auto-truncate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from impl.engine.engine import Engine
from impl.engine.intake import InvalidRequest
from impl.engine.req import Req
from impl.sampling.sampling_params import SamplingParams
from impl.server.errors import APIError
from impl.server.intake import TEXT_BOUND_SLACK, check_context, check_text_size, fit_prompt
from impl.server.limits import RequestLimits
from impl.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest


@dataclass
class Submission:
    reqs: list[Req]
    num_prompts: int
    n: int
    single: bool  # one prompt given as a scalar (not a batch)

    def prompt_of(self, k: int) -> int:
        return k // self.n


def _sampling(d: Any, where: str = "sampling_params") -> SamplingParams:
    if d is not None and not isinstance(d, dict):
        d = d.model_dump(exclude_none=True)
    try:
        return SamplingParams.from_dict(d)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"{where}: {e}", where) from None


def _expand(engine: Engine, prompts: list[list[int]], sps: list[SamplingParams], return_logprob: Any,
            logprob_start_len: Any, top_logprobs_num: Any, rid: Any, field: str) -> list[Req]:
    """B prompts x n choices -> validated Reqs (per-prompt values: a scalar or one per prompt);
    the engine's refusals about the prompt name ``field``."""
    try:
        return engine.expand_requests(prompts, sps, return_logprob, logprob_start_len, top_logprobs_num, rid)
    except InvalidRequest as e:
        param = field if e.field == "input_ids" else e.field
        msg = str(e)
        raise APIError(400, msg if msg.startswith(param) else f"{param}: {msg}", param) from None


def _per_prompt(value: Any, b: int, name: str) -> list[Any]:
    """Per-prompt sampling_params (parsed here: the batch's ``n`` shapes the response)."""
    if isinstance(value, list):
        if len(value) != b:
            raise APIError(400, f"'{name}' has {len(value)} entries for a batch of {b} prompts", name)
        return list(value)
    return [value] * b


def _encode(engine: Engine, text: str, name: str, limits: RequestLimits) -> list[int]:
    if not text:
        raise APIError(400, f"'{name}' must be a non-empty string", name)
    check_text_size(len(text), engine.tokenizer.max_token_chars, limits, name)
    if limits.allow_auto_truncate:  # the first context_len tokens come from at most this many characters
        text = text[: TEXT_BOUND_SLACK * engine.tokenizer.max_token_chars * limits.context_len]
    return fit_prompt(engine.encode(text), limits, name)


def _check_ids(ids: Sequence[int], name: str, limits: RequestLimits) -> list[int]:
    if not ids:
        raise APIError(400, f"'{name}' must be a non-empty list of token ids", name)
    return fit_prompt(list(ids), limits, name)


# ---------------------------------------------------------------- /generate


def from_generate(engine: Engine, body: GenerateRequest, limits: RequestLimits) -> Submission:
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "pass exactly one of 'text' or 'input_ids'", "text")
    if body.text is not None:
        single = isinstance(body.text, str)
        texts = [body.text] if single else body.text
        if not texts:
            raise APIError(400, "'text' must be a non-empty string or a non-empty list of strings", "text")
        prompts = [_encode(engine, t, "text", limits) for t in texts]
    else:
        ids = body.input_ids
        single = not ids or not isinstance(ids[0], list)
        prompts = ([_check_ids(ids, "input_ids", limits)] if single
                   else [_check_ids(x, "input_ids", limits) for x in ids])
    b = len(prompts)
    sp_dicts = _per_prompt(body.sampling_params, b, "sampling_params")
    sps = [_sampling(d) for d in sp_dicts]
    ns = {sp.n for sp in sps}
    if len(ns) != 1:
        raise APIError(400, "every prompt of a batch must use the same sampling_params.n", "sampling_params")
    reqs = _expand(engine, prompts, sps, body.return_logprob, body.logprob_start_len, body.top_logprobs_num, body.rid,
                   "text" if body.text is not None else "input_ids")
    explicit = all(d is not None and getattr(d, "max_new_tokens", None) is not None for d in sp_dicts)
    check_context(reqs, explicit, limits, "max_new_tokens")
    return Submission(reqs, b, ns.pop(), single)


# ---------------------------------------------------------------- OpenAI


def _openai_sampling(body: CompletionRequest | ChatCompletionRequest, max_tokens: int | None, max_req_len: int) -> SamplingParams:
    if max_tokens is not None and max_tokens < 0:
        raise APIError(400, f"'max_tokens' must be at least 0, got {max_tokens}", "max_tokens")
    d = {
        "max_new_tokens": max_tokens if max_tokens is not None else max_req_len,
        "min_new_tokens": body.min_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "n": body.n,
        "stop": body.stop,
        "stop_token_ids": body.stop_token_ids,
        "seed": body.seed,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repetition_penalty": body.repetition_penalty,
        "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens,
    }
    d = {k: v for k, v in d.items() if v is not None}
    try:
        return SamplingParams.from_dict(d)
    except (ValueError, TypeError) as e:
        msg = str(e).replace("max_new_tokens", "max_tokens").replace("min_new_tokens", "min_tokens")
        raise APIError(400, msg, msg.split(" ", 1)[0]) from None


def from_completion(engine: Engine, body: CompletionRequest, limits: RequestLimits) -> Submission:
    max_req_len = limits.context_len
    if body.echo:
        raise APIError(400, "'echo' is not supported by this server; send echo=false", "echo")
    p = body.prompt
    if isinstance(p, str):
        prompts, single = [_encode(engine, p, "prompt", limits)], True
    elif not p:
        raise APIError(400, "'prompt' must be a non-empty string, list of strings or list of token ids", "prompt")
    elif isinstance(p[0], str):
        prompts, single = [_encode(engine, t, "prompt", limits) for t in p], False
    elif isinstance(p[0], int):
        prompts, single = [_check_ids(p, "prompt", limits)], True
    else:
        prompts, single = [_check_ids(x, "prompt", limits) for x in p], False
    if body.logprobs is not None and not 0 <= body.logprobs <= 20:
        raise APIError(400, f"'logprobs' must be in [0, 20], got {body.logprobs}", "logprobs")
    sp = _openai_sampling(body, body.max_tokens, max_req_len)
    reqs = _expand(engine, prompts, [sp] * len(prompts), body.logprobs is not None, None, body.logprobs or 0, body.rid,
                   "prompt")
    check_context(reqs, "max_tokens" in body.model_fields_set and body.max_tokens is not None, limits, "max_tokens")
    return Submission(reqs, len(prompts), sp.n, single)


def from_chat(engine: Engine, body: ChatCompletionRequest, limits: RequestLimits, chat_template: str | None) -> Submission:
    max_req_len = limits.context_len
    if not body.messages:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise APIError(400, f"'top_logprobs' must be in [0, 20], got {body.top_logprobs}", "top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    chars = sum(len(m["content"]) if isinstance(m.get("content"), str) else
                sum(len(p["text"]) for p in m.get("content") or []) for m in messages)
    check_text_size(chars, engine.tokenizer.max_token_chars, limits, "messages")
    try:
        ids = engine.tokenizer.encode_chat(messages, body.add_generation_prompt, chat_template)
    except ValueError as e:
        raise APIError(400, f"messages: {e}", "messages") from None
    ids = fit_prompt(ids, limits, "messages")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    sp = _openai_sampling(body, SamplingParams.max_new_tokens if max_tokens is None else max_tokens, max_req_len)
    reqs = _expand(engine, [ids], [sp], bool(body.logprobs), None, body.top_logprobs or 0, body.rid, "messages")
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    check_context(reqs, max_tokens is not None, limits, name)
    return Submission(reqs, 1, sp.n, True)
