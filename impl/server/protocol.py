"""Request bodies of the HTTP API: typed, bounded pydantic models.

Field names follow SGLang's ``GenerateReqInput`` / ``SamplingParams`` and the
OpenAI API. Every field is strict (``true`` is not an integer, ``"5"`` is not
a number), floats are finite, integers are 64-bit safe and every range is
checked here, before anything is tokenized or queued. ``request_models(limits)``
builds the models with the server's limits (``limits.py``) baked into the
field ranges: the same classes validate bodies and are published as each
route's OpenAPI ``requestBody`` (``openapi_schema.py``), so a schema-driven
client or fuzzer generates exactly the requests the server accepts.

Unknown top-level fields are ignored because real clients send extras
(SGLang's bench client sends ``lora_path``, the ``openai`` client ``user``);
unknown *sampling* fields are refused. OpenAI fields this server does not
implement (``tools``, ``response_format``, ...) are declared with the only
value that means "not used" (``tool_choice: "none"``, an empty ``tools``
list); anything else is a 400 saying the feature is not supported.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from impl.server.limits import RequestLimits

I64_MAX = 2**63 - 1
I32_MAX = 2**31 - 1
Finite = Annotated[float, Field(allow_inf_nan=False)]


def _integral(v: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: accept integral floats as ints (strict mode still refuses true, "3")."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def Int(**range_: Any) -> Any:
    return Annotated[int, Field(**range_), BeforeValidator(_integral)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _no_zero_top_k(v: Optional[int]) -> Optional[int]:
    if v == 0:
        raise ValueError("top_k must be -1 (disable) or at least 1, got 0")
    return v


def _unsupported(name: str, what: str) -> ValueError:
    return ValueError(f"'{name}' is not supported by this server ({what}); remove the field")


class StreamOptions(_Body):
    include_usage: bool = False


@dataclass(frozen=True)
class RequestModels:
    """The body models of one server (its limits baked in)."""

    sampling: type[BaseModel]
    generate: type[BaseModel]
    completion: type[BaseModel]
    chat: type[BaseModel]
    abort: type[BaseModel]


def request_models(lim: RequestLimits) -> RequestModels:
    # Prompt length and prompt + max_new_tokens are not ranges of the body: the engine's intake fits them to
    # the context (or truncates, under --allow-auto-truncate), naming both numbers.
    TokT = Int(ge=0, le=min(I32_MAX, lim.vocab_size - 1))
    IdsT = Annotated[list[TokT], Field(min_length=1)]
    TextT = Annotated[str, Field(min_length=1)]
    NewTokensT = Int(ge=0, le=I32_MAX)
    NT = Int(ge=1, le=lim.max_n)
    TopKT = Int(ge=-1, le=I32_MAX, json_schema_extra={"not": {"const": 0}})
    StopStrT = Annotated[str, Field(min_length=1, max_length=lim.max_stop_string_len)]
    StopT = Union[StopStrT, Annotated[list[StopStrT], Field(max_length=lim.max_stop_strings)]]
    StopIdsT = Annotated[list[TokT], Field(max_length=lim.max_stop_token_ids)]
    SeedT = Int(ge=0, le=I64_MAX - lim.max_n)
    LogprobsNumT = Int(ge=0, le=lim.max_logprobs)
    StartT = Int(ge=-1, le=I32_MAX)
    batch = lim.max_batch_size
    RidT = Annotated[str, Field(min_length=1, max_length=256)]

    def many(t: Any) -> Any:
        return Annotated[list[t], Field(min_length=1, max_length=batch)]

    class SamplingParamsBody(_Closed):
        """SGLang's sampling_params (POST /generate)."""

        max_new_tokens: Optional[NewTokensT] = None
        min_new_tokens: Optional[NewTokensT] = None
        temperature: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None
        top_p: Optional[Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]] = None
        top_k: Optional[TopKT] = None
        min_p: Optional[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] = None
        frequency_penalty: Optional[Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]] = None
        presence_penalty: Optional[Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]] = None
        repetition_penalty: Optional[Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]] = None
        stop: Optional[StopT] = None
        stop_token_ids: Optional[StopIdsT] = None
        ignore_eos: Optional[bool] = None
        skip_special_tokens: Optional[bool] = None
        no_stop_trim: Optional[bool] = None
        n: Optional[NT] = None
        seed: Optional[SeedT] = None
        sampling_seed: Optional[SeedT] = None

        _top_k = field_validator("top_k")(_no_zero_top_k)

        @model_validator(mode="after")
        def _min_le_max(self):
            if self.min_new_tokens is not None and self.min_new_tokens > (
                    self.max_new_tokens if self.max_new_tokens is not None else 128):
                raise ValueError("min_new_tokens must not exceed max_new_tokens")
            return self

        def as_dict(self) -> dict[str, Any]:
            return self.model_dump(exclude_none=True)

    class GenerateRequest(_Body):
        """POST /generate (SGLang-native). A batch: lists in ``text`` / ``input_ids`` and per-prompt lists elsewhere."""

        model_config = ConfigDict(json_schema_extra={"oneOf": [  # exactly one of text / input_ids
            {"required": ["text"], "properties": {"text": {"type": ["string", "array"]}}},
            {"required": ["input_ids"], "properties": {"input_ids": {"type": "array"}}},
        ]})

        text: Union[TextT, many(TextT), None] = None
        input_ids: Union[IdsT, many(IdsT), None] = None
        sampling_params: Union[SamplingParamsBody, many(SamplingParamsBody), None] = None
        rid: Union[RidT, many(RidT), None] = None
        return_logprob: Union[bool, many(bool), None] = None
        logprob_start_len: Union[StartT, many(StartT), None] = None
        top_logprobs_num: Union[LogprobsNumT, many(LogprobsNumT), None] = None
        stream: bool = False

        @model_validator(mode="after")
        def _batch_shape(self):
            if (self.text is None) == (self.input_ids is None):
                raise ValueError("pass exactly one of 'text' or 'input_ids'")
            prompts = self.text if self.text is not None else self.input_ids
            b = 1 if isinstance(prompts, str) or not isinstance(prompts[0], list) else len(prompts)
            for name in ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num"):
                v = getattr(self, name)
                if isinstance(v, list) and len(v) != b:
                    raise ValueError(f"'{name}' has {len(v)} entries for a batch of {b} prompts")
            if isinstance(self.sampling_params, list) and len({sp.n or 1 for sp in self.sampling_params}) > 1:
                raise ValueError("every prompt of a batch must use the same sampling_params.n")
            return self

    class _OpenAISampling(_Body):
        """Sampling fields shared by completions and chat (OpenAI names plus SGLang's extras)."""

        model: Optional[str] = None
        temperature: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None
        top_p: Optional[Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]] = None
        top_k: Optional[TopKT] = None
        min_p: Optional[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] = None
        n: NT = 1
        stop: Optional[StopT] = None
        stop_token_ids: Optional[StopIdsT] = None
        seed: Optional[SeedT] = None
        presence_penalty: Optional[Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]] = None
        frequency_penalty: Optional[Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]] = None
        repetition_penalty: Optional[Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]] = None
        ignore_eos: bool = False
        skip_special_tokens: bool = True
        min_tokens: NewTokensT = 0
        stream: bool = False
        stream_options: Optional[StreamOptions] = None
        rid: Optional[RidT] = None
        user: Optional[str] = None
        # OpenAI fields this server does not implement: only their "unused" value is accepted
        logit_bias: Optional[Annotated[dict[str, float], Field(max_length=0)]] = None
        best_of: Optional[Int(ge=1, le=1)] = None

        _top_k = field_validator("top_k")(_no_zero_top_k)

        @field_validator("logit_bias", mode="before")
        @classmethod
        def _logit_bias(cls, v: Any) -> Any:
            if v:
                raise _unsupported("logit_bias", "token biases are not implemented")
            return v

        @field_validator("best_of", mode="before")
        @classmethod
        def _best_of(cls, v: Any) -> Any:
            if v is not None and v != 1:
                raise _unsupported("best_of", "only best_of=1 is served; use n for several choices")
            return v

    class CompletionRequest(_OpenAISampling):
        """POST /v1/completions."""

        prompt: Union[TextT, many(TextT), IdsT, many(IdsT)]
        max_tokens: Optional[NewTokensT] = 16
        logprobs: Optional[LogprobsNumT] = None
        echo: Annotated[bool, Field(json_schema_extra={"const": False})] = False
        suffix: Optional[Literal[""]] = None
        # vLLM's extension: each choice carries its output token ids ("token_ids"; per chunk when streamed)
        return_token_ids: bool = False

        @field_validator("echo", mode="before")
        @classmethod
        def _echo(cls, v: Any) -> Any:
            if v is True:
                raise _unsupported("echo", "the prompt is not echoed; send echo=false")
            return v

        @field_validator("suffix", mode="before")
        @classmethod
        def _suffix(cls, v: Any) -> Any:
            if v:
                raise _unsupported("suffix", "insertion is not implemented")
            return v

    class TextPart(_Closed):
        type: Literal["text"]
        text: str

    class ResponseFormat(_Closed):
        type: Literal["text"]

    class ChatMessage(_Body):
        role: Literal["system", "developer", "user", "assistant"]
        content: Union[str, Annotated[list[TextPart], Field(max_length=1024)], None] = None
        name: Optional[str] = None

        @field_validator("content", mode="before")
        @classmethod
        def _content(cls, v: Any) -> Any:
            if isinstance(v, list):
                for part in v:
                    if isinstance(part, dict) and part.get("type") not in (None, "text"):
                        raise ValueError(f"only text content parts are supported, got type {part.get('type')!r}")
            return v

    class ChatCompletionRequest(_OpenAISampling):
        """POST /v1/chat/completions."""

        model_config = ConfigDict(json_schema_extra={
            # OpenAI's rule, in the schema: top_logprobs > 0 needs logprobs: true
            "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
            "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
        })

        messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
        max_tokens: Optional[NewTokensT] = None
        max_completion_tokens: Optional[NewTokensT] = None
        logprobs: bool = False
        top_logprobs: Optional[LogprobsNumT] = None
        add_generation_prompt: bool = True
        # OpenAI fields this server does not implement
        tools: Optional[Annotated[list[Any], Field(max_length=0)]] = None
        tool_choice: Optional[Literal["none"]] = None
        response_format: Optional[ResponseFormat] = None
        functions: Optional[Annotated[list[Any], Field(max_length=0)]] = None
        function_call: Optional[Literal["none"]] = None
        parallel_tool_calls: Optional[bool] = None

        @field_validator("tools", "functions", mode="before")
        @classmethod
        def _tools(cls, v: Any, info) -> Any:
            if v:
                raise _unsupported(info.field_name, "tool / function calling is not implemented")
            return v

        @field_validator("tool_choice", "function_call", mode="before")
        @classmethod
        def _tool_choice(cls, v: Any, info) -> Any:
            if v is not None and v != "none":
                raise _unsupported(info.field_name, "tool / function calling is not implemented; only 'none' is accepted")
            return v

        @field_validator("response_format", mode="before")
        @classmethod
        def _response_format(cls, v: Any) -> Any:
            if v is not None and v != {"type": "text"} and not isinstance(v, BaseModel):
                raise _unsupported("response_format", "structured output (json_object, json_schema) is not implemented; "
                                   "only {'type': 'text'} is accepted")
            return v

        @model_validator(mode="after")
        def _top_logprobs_needs_logprobs(self):
            if self.top_logprobs and not self.logprobs:
                raise ValueError("'top_logprobs' needs 'logprobs': true")
            return self

    class AbortRequest(_Body):
        """POST /abort_request: one request id, or every request."""

        model_config = ConfigDict(json_schema_extra={"anyOf": [
            {"required": ["rid"], "properties": {"rid": {"type": "string"}}},
            {"required": ["abort_all"], "properties": {"abort_all": {"const": True}}},
        ]})

        rid: Optional[RidT] = None
        abort_all: bool = False

    return RequestModels(SamplingParamsBody, GenerateRequest, CompletionRequest, ChatCompletionRequest, AbortRequest)


DEFAULT_MODELS = request_models(RequestLimits())
GenerateRequest = DEFAULT_MODELS.generate
CompletionRequest = DEFAULT_MODELS.completion
ChatCompletionRequest = DEFAULT_MODELS.chat
AbortRequest = DEFAULT_MODELS.abort
