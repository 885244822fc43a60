"""HTTP request bodies -> engine ``Req`` objects: a mapping of API fields, nothing more.

It runs on the HTTP intake thread pool (``impl/server/intake.py``), never on
the event loop. One gate per layer: the body models (``protocol.py``) have
checked every shape and range with the server's limits; this module maps each
API's fields onto the engine's arguments (texts through ``Engine.encode_prompt``
/ ``encode_chat``, sampling fields as a dict, the route's ``max_new_tokens``
default) and hands the batch to ``Engine.expand_requests``
(``impl/engine/intake.py``), which checks everything semantic once: the
context fit of prompt and ``max_new_tokens`` (or truncation under
``--allow-auto-truncate``), the vocabulary, the sampling params. The engine's
refusals become an ``APIError(400)`` naming the route's own field (``text``,
``input_ids``, ``prompt``, ``messages``, ``max_tokens``, ...).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Iterator

from impl.engine.engine import Engine
from impl.engine.intake import InvalidRequest
from impl.engine.req import Req
from impl.server.beam_search import BeamSpec
from impl.server.errors import APIError
from impl.tool_calls.chat import prepare_messages
from impl.tool_calls.grammar import forced_call_grammar

# The body models are classes each server builds with its limits baked into the pydantic types
# (protocol.request_models), which a type checker cannot name: here they are read as Any, field by field, and the
# fields this module reads are pinned by tests/server (test_req_builder, test_limits, the HTTP contracts).
GenerateBody = Any  # protocol.RequestModels.generate
CompletionBody = Any  # protocol.RequestModels.completion
ChatBody = Any  # protocol.RequestModels.chat

# The engine's sampling field names -> the OpenAI routes' names
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


@dataclass
class Submission:
    reqs: list[Req]
    num_prompts: int
    n: int
    single: bool  # one prompt given as a scalar (not a batch)
    tool_calls: bool = False  # chat with tools: parse the output's function calls (impl/tool_calls)
    # echo: per prompt, the text its choices' text starts with (completions: the prompt; chat: vLLM's echo of the final
    # assistant message)
    echo: tuple[str, ...] | None = None
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: each prompt token's entry with this many top tokens
    top_logprobs: int = 0  # the output's (and echo's) top entries shown per token; the engine may give more
    beam: BeamSpec | None = None  # vLLM's use_beam_search: the requests are templates (prompt, max_new_tokens)

    def prompt_of(self, k: int) -> int:
        return k // self.n


@contextlib.contextmanager
def _named(prompt_field: str, renames: dict[str, str] | None = None) -> Iterator[None]:
    """The engine's InvalidRequest as a 400 naming the body's field: the prompt's, or a sampling field. ``renames``
    (the OpenAI routes, which have no ``sampling_params`` object): the engine's sampling field names -> the
    route's; there a sampling refusal names its own field (``e.sampling_field``), renamed."""
    try:
        yield
    except InvalidRequest as e:
        msg, param = str(e), e.field
        if param == "input_ids":
            param = prompt_field
        if renames is not None and param == "sampling_params" and e.sampling_field is not None:
            param = e.sampling_field
        for old, new in (renames or {}).items():
            msg = msg.replace(old, new)
            param = new if param == old else param
        raise APIError(400, msg if msg.startswith(param) else f"'{param}': {msg}", param) from None


# ---------------------------------------------------------------- /generate


def from_generate(engine: Engine, body: GenerateBody) -> Submission:
    """The body model has checked: exactly one of text / input_ids, per-prompt lists of the batch's size, one n."""
    field = "text" if body.text is not None else "input_ids"
    single = isinstance(body.text, str) or (body.input_ids is not None and not isinstance(body.input_ids[0], list))
    sp = body.sampling_params
    sampling = [s.as_dict() for s in sp] if isinstance(sp, list) else (sp.as_dict() if sp is not None else None)
    first = sp[0] if isinstance(sp, list) else sp
    with _named(field):
        if body.text is not None:
            prompts = [engine.encode_prompt(t) for t in ([body.text] if single else body.text)]
        else:
            prompts = [list(body.input_ids)] if single else [list(x) for x in body.input_ids]
        reqs = engine.expand_requests(prompts, sampling, body.return_logprob, body.logprob_start_len,
                                      body.top_logprobs_num, body.rid, cache_salt=body.cache_salt)
    return Submission(reqs, len(prompts), (first.n if first is not None else None) or 1, single)


# ---------------------------------------------------------------- OpenAI


def _openai_sampling(body: CompletionBody | ChatBody, max_tokens: int | None, grammar: dict[str, str],
                     engine: Engine) -> dict[str, Any]:
    """The engine's sampling dict; ``max_new_tokens`` only when the client chose it (else the route's default);
    ``grammar``: the output's constraint (``output_constraint``); ``bad_words`` tokenized by ``engine``'s tokenizer."""
    d = {
        "max_new_tokens": max_tokens,
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
        "logit_bias": body.logit_bias or None,
        "allowed_token_ids": body.allowed_token_ids,
        "no_stop_trim": True if body.no_stop_trim or body.include_stop_str_in_output else None,
        "bad_words_token_ids": bad_words_token_ids(engine, body.bad_words),
        **grammar,
    }
    return {k: v for k, v in d.items() if v is not None}


def bad_words_token_ids(engine: Engine, words: list[str] | None) -> list[list[int]] | None:
    """vLLM's bad_words as token sequences: each word (leading spaces dropped) as written, and after a space where
    that starts with another token in as many tokens (the word inside a text); a word with no tokens is a 400."""
    if not words:
        return None
    out: list[list[int]] = []
    for word in dict.fromkeys(words):
        plain = engine.tokenizer.encode(word.lstrip(), False)
        if not plain:
            raise APIError(400, f"bad_words entry {word!r} has no tokens; remove it", "bad_words")
        spaced = engine.tokenizer.encode(" " + word.lstrip(), False)
        out.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def output_constraint(body: CompletionBody | ChatBody) -> tuple[dict[str, str], str]:
    """(the engine's grammar field, the body field it came from) of the one constraint on an OpenAI route's output:
    ``response_format``, SGLang's ``regex`` / ``ebnf`` / ``json_schema``, vLLM's ``structured_outputs`` or its ``guided_*`` spellings
    (a choice list becomes the regex of its literal alternatives, a JSON Schema object its JSON text). Two of them
    are a 400 naming both."""
    so = body.structured_outputs
    given: dict[str, dict[str, str]] = {
        "response_format": response_format_grammar(body.response_format),
        "regex": {"regex": body.regex} if body.regex is not None else {},
        "ebnf": {"ebnf": body.ebnf} if body.ebnf is not None else {},
        "json_schema": _vllm_constraint(body.json_schema, None, None, None),
        "structured_outputs": {} if so is None else _vllm_constraint(so.json_, so.regex, so.choice, so.grammar),
        "guided_json": _vllm_constraint(body.guided_json, None, None, None),
        "guided_regex": _vllm_constraint(None, body.guided_regex, None, None),
        "guided_choice": _vllm_constraint(None, None, body.guided_choice, None),
        "guided_grammar": _vllm_constraint(None, None, None, body.guided_grammar),
    }
    named = [k for k, v in given.items() if v]
    if len(named) > 1:
        raise APIError(400, f"'{named[1]}': the output takes one constraint, but {', '.join(map(repr, named))} were "
                            "given; keep one", named[1])
    return (given[named[0]], named[0]) if named else ({}, "response_format")


_REGEX_SPECIAL = frozenset(".^$*+?()[]{}|\\/")


def _literal_regex(text: str) -> str:
    """A regex matching exactly ``text`` (its metacharacters escaped, control characters as escapes)."""
    out = []
    for ch in text:
        if ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return "".join(out)


def _vllm_constraint(js: Any, regex: str | None, choice: list[str] | None, grammar: str | None) -> dict[str, str]:
    if js is not None:
        return {"json_schema": js if isinstance(js, str) else json.dumps(js)}
    if regex is not None:
        return {"regex": regex}
    if choice is not None:
        return {"regex": "(" + "|".join(_literal_regex(c) for c in choice) + ")"}
    if grammar is not None:
        return {"ebnf": grammar}
    return {}


# response_format json_object: any JSON object (SGLang's mapping)
JSON_OBJECT_SCHEMA = '{"type": "object"}'


def response_format_grammar(rf: Any) -> dict[str, str]:
    """OpenAI ``response_format`` -> the engine's grammar field (``{}`` for text / none)."""
    if rf is None or rf.type == "text":
        return {}
    if rf.type == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}
    schema = rf.json_schema.schema_
    return {"json_schema": json.dumps(schema if schema is not True else {})}


def from_completion(engine: Engine, body: CompletionBody) -> Submission:
    p = body.prompt
    single = isinstance(p, str) or isinstance(p[0], int)
    explicit = "max_tokens" in body.model_fields_set
    # max_tokens unset: OpenAI's default 16; an explicit null: as many as the context leaves
    default = None if explicit and body.max_tokens is not None else (
        16 if not explicit else engine.intake_policy.max_req_len)
    grammar, grammar_field = output_constraint(body)
    sampling = _openai_sampling(body, body.max_tokens if explicit else None, grammar, engine)
    keep, keep_last = _truncation(engine, body)
    with _named("prompt", _OPENAI_NAMES):
        texts = [p] if isinstance(p, str) else list(p) if isinstance(p[0], str) else None
        if texts is not None:
            prompts = [engine.encode_prompt(t, body.add_special_tokens is not False, keep, keep_last) for t in texts]
        else:
            prompts = [_truncated(list(x), keep, keep_last) for x in ([p] if single else p)]
        if keep is not None:
            texts = None  # echo: what was kept, decoded
        reqs = engine.expand_requests(prompts, sampling, rid=body.rid, default_max_new_tokens=default,
                                      grammar_field=grammar_field, cache_salt=body.cache_salt,
                                      **_logprob_args(body.logprobs is not None, body.logprobs or 0,
                                                      body.prompt_logprobs, body.echo))
    return Submission(reqs, len(prompts), body.n, single,
                      echo=_echo_texts(engine, texts, prompts, reqs, body.n) if body.echo else None,
                      prompt_logprobs=body.prompt_logprobs, top_logprobs=body.logprobs or 0, beam=_beam_spec(body))


def _logprob_args(output: bool, k: int, prompt_logprobs: int | None, echo: bool = False) -> dict[str, Any]:
    """``expand_requests``' logprob arguments of an OpenAI body: the output's logprobs (``output``; ``k`` top entries
    shown), vLLM's ``prompt_logprobs`` and completions' ``echo`` (with logprobs: every prompt token's entry, the first
    None, as nothing precedes it) need the prompt's entries from token 0, prompt_logprobs their ranks too. The engine
    gives the larger k; each list is cut to its own when formatted."""
    plp = prompt_logprobs
    return {"return_logprob": output or plp is not None, "logprob_start_len": 0 if echo or plp is not None else None,
            "top_logprobs_num": max(k, plp or 0), "input_token_ranks": plp is not None}


def _truncation(engine: Engine, body: CompletionBody | ChatBody) -> tuple[int | None, bool]:
    """vLLM's truncate_prompt_tokens (-1: the context's prompt room) and truncation_side, as (tokens kept or None,
    whether the last ones are); more than the context's prompt room is a 400."""
    n, room = body.truncate_prompt_tokens, engine.intake_policy.max_prompt_len
    if n is None:
        return None, True
    if n > room:
        raise APIError(400, f"'truncate_prompt_tokens': {n} is more than the context's {room} prompt tokens; ask for "
                            f"at most {room}, or -1", "truncate_prompt_tokens")
    return (room if n == -1 else n), body.truncation_side != "right"


def _truncated(ids: list[int], keep: int | None, keep_last: bool) -> list[int]:
    if keep is None:
        return ids
    return (ids[len(ids) - keep:] if keep else []) if keep_last else ids[:keep]


def _echo_texts(engine: Engine, texts: list[str] | None, prompts: list[list[int]], reqs: list[Req],
                n: int) -> tuple[str, ...]:
    """The text each prompt's choices start with under echo: a text prompt as sent, token ids decoded with their special
    tokens (vLLM's echo of token prompts), a prompt cut by --allow-auto-truncate as what was kept."""
    out = []
    for p, ids in enumerate(prompts):
        kept = reqs[p * n].origin_input_ids
        out.append(texts[p] if texts is not None and len(kept) == len(ids) else engine.tokenizer.decode(kept, False))
    return tuple(out)


def tokenize(engine: Engine, body: Any, chat_template: str | None) -> tuple[list[int], list[str] | None]:
    """POST /tokenize: (the ids, each id's text when ``return_token_strs``). A text with the tokenizer's special tokens
    unless ``add_special_tokens`` is false; messages through the chat template (``add_special_tokens`` true adds the
    tokenizer's on top, as vLLM's does), refused as /v1/chat/completions refuses them."""
    tok = engine.tokenizer
    if body.prompt is not None:
        ids = tok.encode(body.prompt, body.add_special_tokens is not False)
    else:
        with _named("messages"):
            ids = _chat_ids(engine, body, [], chat_template)
    strs = [tok.id_to_token(i) or "" for i in ids] if body.return_token_strs else None
    return ids, strs


def _chat_ids(engine: Engine, body: Any, tools: list[dict[str, Any]], chat_template: str | None) -> list[int]:
    """The ids of a chat body's messages (and ``tools``) through the chat template, with its add_generation_prompt,
    continue_final_message and chat_template_kwargs, and with ``add_special_tokens`` true the tokenizer's bos on top
    of the template's (vLLM's); a refusal is an InvalidRequest on ``messages``."""
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        msgs, extra = prepare_messages(messages, tools, chat_template or engine.tokenizer.chat_template)
    except ValueError as e:
        raise InvalidRequest(str(e), "messages") from None
    ids = engine.encode_chat(msgs, body.add_generation_prompt, chat_template, body.continue_final_message,
                             **(body.chat_template_kwargs or {}), **extra)
    bos = engine.tokenizer.bos_token_id
    return [bos, *ids] if body.add_special_tokens and bos is not None else ids


def _chat_tools(body: ChatBody) -> list[dict[str, Any]]:
    """The tool declarations the template shows (tool_choice "none": none, and the output is not parsed)."""
    return [t.model_dump(exclude_none=True) for t in body.tools or []] if body.tool_choice != "none" else []


def chat_prompt_len(engine: Engine, body: ChatBody, chat_template: str | None) -> int:
    """How many tokens a chat body's prompt has, as ``from_chat`` builds it (InvalidRequest as it refuses)."""
    return len(_chat_ids(engine, body, _chat_tools(body), chat_template))


def from_chat(engine: Engine, body: ChatBody, chat_template: str | None) -> Submission:
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    tc = body.tool_choice
    tools = _chat_tools(body)
    grammar, grammar_field = output_constraint(body)
    sampling = _openai_sampling(body, max_tokens, grammar, engine)
    if tools:
        sampling["skip_special_tokens"] = False  # Gemma-4's call markers are special tokens: keep them to parse
        if tc == "required" or (tc is not None and not isinstance(tc, str)):
            sampling["ebnf"] = forced_call_grammar(tools, None if tc == "required" else tc.function.name,
                                                   parallel=body.parallel_tool_calls is not False)
            grammar_field = "tool_choice"
    keep, keep_last = _truncation(engine, body)
    with _named("messages", {"max_new_tokens": name, "min_new_tokens": "min_tokens"}):
        ids = _truncated(_chat_ids(engine, body, tools, chat_template), keep, keep_last)
        reqs = engine.expand_requests([ids], sampling, rid=body.rid, grammar_field=grammar_field,
                                      cache_salt=body.cache_salt,
                                      **_logprob_args(bool(body.logprobs), body.top_logprobs or 0, body.prompt_logprobs))
    return Submission(reqs, 1, body.n, True, tool_calls=bool(tools), prompt_logprobs=body.prompt_logprobs,
                      top_logprobs=body.top_logprobs or 0, echo=_chat_echo(body) if body.echo else None,
                      beam=_beam_spec(body))


def _beam_spec(body: CompletionBody | ChatBody) -> BeamSpec | None:
    """vLLM's beam search: ``n`` beams (the body's model refused what does not apply to it)."""
    if not body.use_beam_search:
        return None
    return BeamSpec(body.n, 1.0 if body.length_penalty is None else body.length_penalty,
                    body.include_stop_str_in_output)


def _chat_echo(body: ChatBody) -> tuple[str] | None:
    """vLLM's chat echo: a final assistant message's text (text parts joined by newlines) starts the answer."""
    last = body.messages[-1]
    if last.role != "assistant" or not last.content:
        return None
    return (last.content if isinstance(last.content, str) else "\n".join(p.text for p in last.content),)
