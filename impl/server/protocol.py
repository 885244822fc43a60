"""Request bodies of the HTTP API (pydantic, strict types, unknown fields ignored).

Field names follow SGLang's ``GenerateReqInput`` and the OpenAI API. Strict
mode: ``true`` is not an integer and ``"5"`` is not a number, so a wrong type
is a 400 naming the field instead of a silent coercion. Unknown top-level
fields are ignored because real clients send extras (SGLang's bench client
sends ``lora_path``, the ``openai`` client ``user``); unknown *sampling*
fields are refused by ``SamplingParams``.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict

IdList = list[int]
Prompt = Union[str, list[str], list[int], list[list[int]]]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class GenerateRequest(_Body):
    """POST /generate (SGLang-native)."""

    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    sampling_params: Union[dict[str, Any], list[dict[str, Any]], None] = None
    rid: Union[str, list[str], None] = None
    return_logprob: Union[bool, list[bool], None] = None
    logprob_start_len: Union[int, list[int], None] = None
    top_logprobs_num: Union[int, list[int], None] = None
    stream: bool = False


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAISampling(_Body):
    """Sampling fields shared by completions and chat (OpenAI names plus SGLang's extras)."""

    model: Union[str, None] = None
    temperature: Union[float, None] = None
    top_p: Union[float, None] = None
    top_k: Union[int, None] = None
    min_p: Union[float, None] = None
    n: int = 1
    stop: Union[str, list[str], None] = None
    stop_token_ids: Union[list[int], None] = None
    seed: Union[int, None] = None
    presence_penalty: Union[float, None] = None
    frequency_penalty: Union[float, None] = None
    repetition_penalty: Union[float, None] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0
    stream: bool = False
    stream_options: Union[StreamOptions, None] = None
    rid: Union[str, None] = None


class CompletionRequest(_OpenAISampling):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: Union[int, None] = 16
    logprobs: Union[int, None] = None
    echo: bool = False


class ChatMessage(_Body):
    role: str
    content: Union[str, list[dict[str, Any]], None] = None
    name: Union[str, None] = None


class ChatCompletionRequest(_OpenAISampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: Union[int, None] = None
    max_completion_tokens: Union[int, None] = None
    logprobs: bool = False
    top_logprobs: Union[int, None] = None
    add_generation_prompt: bool = True


class AbortRequest(_Body):
    rid: Union[str, None] = None
    abort_all: bool = False
