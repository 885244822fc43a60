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
implement (``functions``, ``suffix``, ...) are declared with the only value
that means "not used"; anything else is a 400 saying the feature is not
supported.

Structured outputs (``docs/structured-outputs.md``): SGLang's
``sampling_params.json_schema`` / ``regex`` / ``ebnf`` (at most one) and
``logit_bias``; OpenAI's ``response_format`` (``text``, ``json_object``,
``json_schema``), ``logit_bias``, and on chat ``tools`` / ``tool_choice`` with
``role: "tool"`` messages and assistant ``tool_calls``. A grammar's source is
bounded here in characters; its content (depth, enum sizes, whether it
compiles) is checked by the engine (``impl/constrained``), still a 400.
"""

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from impl.constrained.limits import GrammarLimits
from impl.sampling.sampling_params import LOGIT_BIAS_RANGE, MAX_BAD_WORDS, MAX_LOGIT_BIAS, SAMPLING_RANGES
from impl.server.limits import RequestLimits
from impl.server.unserved_fields import GENERATE_UNSERVED, OPENAI_UNSERVED, TEXT_ONLY, Unserved

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


def Sampling(name: str) -> Any:
    """A float sampling field: finite, in its range (``SAMPLING_RANGES``, what ``SamplingParams.verify`` checks)."""
    return Annotated[float, Field(**SAMPLING_RANGES[name].bounds(), allow_inf_nan=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _no_zero_top_k(v: Optional[int]) -> Optional[int]:
    if v == 0:
        raise ValueError("top_k must be -1 (disable) or at least 1, got 0")
    return v


# Template variables the server binds itself (impl/model/tokenizer.py apply_chat_template, tools) and the names of
# the rendering calls' own parameters (Engine / Tokenizer encode_chat): a request's chat_template_kwargs may not
# replace them.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "pad_token",
                                    "unk_token", "tools", "raise_exception", "strftime_now", "self", "template",
                                    "chat_template", "continue_final_message"})
TemplateKwargsT = Annotated[dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], Any],
                            Field(max_length=32)]


def _template_kwargs(v: Any) -> Any:
    """``chat_template_kwargs`` (SGLang's and vLLM's): more variables for the chat template (e.g. a template's
    ``enable_thinking``), never one the server binds."""
    bad = sorted(set(v or ()) & RESERVED_TEMPLATE_VARS)
    if bad:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(map(repr, bad))}: the server binds "
                         f"{', '.join(sorted(RESERVED_TEMPLATE_VARS))} itself (send messages / tools / "
                         "add_generation_prompt as their own fields)")
    return v


def _unsupported(name: str, what: str) -> ValueError:
    return ValueError(f"'{name}' is not supported by this server ({what}); remove the field")


def _unused(v: Any, unused: tuple) -> bool:
    """True for a field's "not used" value: one of ``unused``, an empty list, or a list of such values (a batch)."""
    if isinstance(v, list):
        return all(_unused(x, unused) for x in v)
    return any(v is u or (v == u and type(v) is type(u)) for u in unused)


def refuse_unserved(data: Any, unserved: Unserved) -> Any:
    """A body (before validation) that gives a field of ``unserved`` another value than its unused ones: a 400
    naming the field."""
    if isinstance(data, dict):
        for name, (unused, hint) in unserved.items():
            if name in data and not _unused(data[name], unused):
                raise _unsupported(name, hint)
    return data


def _only_unused(name: str, what: str, unused: tuple = (None,)) -> Any:
    """A validator that accepts only the field's "not used" value (``_unused``) and refuses the rest as unsupported."""
    def check(cls, v: Any) -> Any:
        if not _unused(v, unused):
            raise _unsupported(name, what)
        return v
    return field_validator(name, mode="before")(classmethod(check))


class StreamOptions(_Body):
    include_usage: bool = False
    # vLLM's: every chunk carries its choice's usage so far (prompt, completion and total tokens)
    continuous_usage_stats: bool = False


@dataclass(frozen=True)
class RequestModels:
    """The body models of one server (its limits baked in)."""

    sampling: type[BaseModel]
    generate: type[BaseModel]
    completion: type[BaseModel]
    chat: type[BaseModel]
    abort: type[BaseModel]
    tokenize: type[BaseModel]
    detokenize: type[BaseModel]
    responses: type[BaseModel]


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
    SaltT = Annotated[str, Field(min_length=1, max_length=1024)]
    GrammarT = Annotated[str, Field(min_length=1, max_length=GrammarLimits().max_source_bytes)]
    BiasT = Annotated[float, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE, allow_inf_nan=False)]
    # token id (a JSON object key, so a string) -> bias; ids are checked against the vocabulary by the engine
    LogitBiasT = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], BiasT], Field(max_length=MAX_LOGIT_BIAS)]

    def many(t: Any) -> Any:
        return Annotated[list[t], Field(min_length=1, max_length=batch)]

    class SamplingParamsBody(_Closed):
        """SGLang's sampling_params (POST /generate)."""

        max_new_tokens: Optional[NewTokensT] = None
        min_new_tokens: Optional[NewTokensT] = None
        temperature: Optional[Sampling("temperature")] = None
        top_p: Optional[Sampling("top_p")] = None
        top_k: Optional[TopKT] = None
        min_p: Optional[Sampling("min_p")] = None
        frequency_penalty: Optional[Sampling("frequency_penalty")] = None
        presence_penalty: Optional[Sampling("presence_penalty")] = None
        repetition_penalty: Optional[Sampling("repetition_penalty")] = None
        stop: Optional[StopT] = None
        stop_token_ids: Optional[StopIdsT] = None
        ignore_eos: Optional[bool] = None
        skip_special_tokens: Optional[bool] = None
        no_stop_trim: Optional[bool] = None
        n: Optional[NT] = None
        seed: Optional[SeedT] = None
        sampling_seed: Optional[SeedT] = None
        json_schema: Optional[GrammarT] = None
        regex: Optional[GrammarT] = None
        ebnf: Optional[GrammarT] = None
        logit_bias: Optional[LogitBiasT] = None

        _top_k = field_validator("top_k")(_no_zero_top_k)

        @model_validator(mode="after")
        def _one_grammar(self):
            given = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
            if len(given) > 1:
                raise ValueError(f"only one of regex, json_schema or ebnf can be set, got {given}; keep one")
            return self

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
        # each logprob entry's third slot: its token's text (SGLang's field; None without it)
        return_text_in_logprobs: bool = False
        stream: bool = False
        # SGLang fields this server does not implement: only their "unused" value (null, false, empty, or a batch of
        # those: SGLang's bench client sends lora_path null) is accepted; a request that means one is a 400
        image_data: Optional[Any] = None
        audio_data: Optional[Any] = None
        video_data: Optional[Any] = None
        input_embeds: Optional[Any] = None
        lora_path: Optional[Any] = None
        lora_id: Optional[Any] = None
        return_hidden_states: Optional[Any] = None
        token_ids_logprob: Optional[Any] = None
        custom_logit_processor: Optional[Any] = None
        session_params: Optional[Any] = None

        _image = _only_unused("image_data", TEXT_ONLY, (None, ""))
        _audio = _only_unused("audio_data", TEXT_ONLY, (None, ""))
        _video = _only_unused("video_data", TEXT_ONLY, (None, ""))
        _embeds = _only_unused("input_embeds", "prompts are text or token ids")
        _lora_path = _only_unused("lora_path", "LoRA adapters are not served", (None, ""))
        _lora_id = _only_unused("lora_id", "LoRA adapters are not served", (None, ""))
        _hidden = _only_unused("return_hidden_states", "hidden states are not returned", (None, False))
        _ids_lp = _only_unused("token_ids_logprob", "use top_logprobs_num (and logprob_start_len for the prompt)")
        _clp = _only_unused("custom_logit_processor", "custom logit processors are not run; use logit_bias")
        _session = _only_unused("session_params", "sessions are not kept; send the whole conversation")
        # return_prompt_token_ids (SGLang's): each output dict carries its prompt's ids
        return_prompt_token_ids: bool = False
        # SGLang's: prefixes are shared only between requests of one salt (one for all prompts, or one each)
        cache_salt: Union[SaltT, many(SaltT), None] = None
        # SGLang's (sglang-router --dp-aware): the --dp-size front sends the request to this rank; a replica, or a
        # server without a front (SGLang's too), serves it where it is
        data_parallel_rank: Optional[Int(ge=0, le=I32_MAX)] = None

        @model_validator(mode="before")
        @classmethod
        def _unserved(cls, data: Any) -> Any:
            return refuse_unserved(data, GENERATE_UNSERVED)

        @model_validator(mode="after")
        def _batch_shape(self):
            if (self.text is None) == (self.input_ids is None):
                raise ValueError("pass exactly one of 'text' or 'input_ids'")
            prompts = self.text if self.text is not None else self.input_ids
            b = 1 if isinstance(prompts, str) or not isinstance(prompts[0], list) else len(prompts)
            for name in ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
                         "cache_salt"):
                v = getattr(self, name)
                if isinstance(v, list) and len(v) != b:
                    raise ValueError(f"'{name}' has {len(v)} entries for a batch of {b} prompts")
            if isinstance(self.sampling_params, list) and len({sp.n or 1 for sp in self.sampling_params}) > 1:
                raise ValueError("every prompt of a batch must use the same sampling_params.n")
            return self

    class JsonSchemaSpec(_Body):
        """response_format.json_schema (OpenAI): the schema and its name; ``strict`` is accepted (the output is
        always constrained to the schema)."""

        model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

        name: Annotated[str, Field(min_length=1, max_length=256)] = "response"
        description: Optional[Annotated[str, Field(max_length=GrammarLimits().max_source_bytes)]] = None
        schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
        strict: Optional[bool] = None

    class ResponseFormat(_Body):
        type: Literal["text", "json_object", "json_schema"]
        json_schema: Optional[JsonSchemaSpec] = None

        @model_validator(mode="after")
        def _schema_given(self):
            if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
                raise ValueError("response_format of type 'json_schema' needs json_schema.schema (a JSON Schema "
                                 "object); or use type 'json_object' for any JSON object")
            return self

    ChoiceT = Annotated[list[Annotated[str, Field(min_length=1, max_length=GrammarLimits().max_source_bytes)]],
                        Field(min_length=1, max_length=256)]
    JsonSpecT = Union[dict[str, Any], GrammarT]  # a JSON Schema, as an object or as its JSON text

    class StructuredOutputs(_Closed):
        """vLLM's ``structured_outputs``: exactly one of a JSON Schema, a regex, a list of choices, an EBNF grammar."""

        json_: Optional[JsonSpecT] = Field(default=None, alias="json")
        regex: Optional[GrammarT] = None
        choice: Optional[ChoiceT] = None
        grammar: Optional[GrammarT] = None

        @model_validator(mode="after")
        def _exactly_one(self):
            given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
            if len(given) != 1:
                raise ValueError("structured_outputs takes exactly one of 'json', 'regex', 'choice' or 'grammar', got "
                                 f"{[g.rstrip('_') for g in given] or 'none'}")
            return self

    class _OpenAISampling(_Body):
        """Sampling fields shared by completions and chat (OpenAI names plus SGLang's and vLLM's extras)."""

        route: ClassVar[str] = "chat"

        model: Optional[str] = None
        temperature: Optional[Sampling("temperature")] = None
        top_p: Optional[Sampling("top_p")] = None
        top_k: Optional[TopKT] = None
        min_p: Optional[Sampling("min_p")] = None
        n: NT = 1
        stop: Optional[StopT] = None
        stop_token_ids: Optional[StopIdsT] = None
        seed: Optional[SeedT] = None
        presence_penalty: Optional[Sampling("presence_penalty")] = None
        frequency_penalty: Optional[Sampling("frequency_penalty")] = None
        repetition_penalty: Optional[Sampling("repetition_penalty")] = None
        ignore_eos: bool = False
        skip_special_tokens: bool = True
        min_tokens: NewTokensT = 0
        stream: bool = False
        stream_options: Optional[StreamOptions] = None
        rid: Optional[RidT] = None
        user: Optional[str] = None
        logit_bias: Optional[LogitBiasT] = None
        response_format: Optional[ResponseFormat] = None
        # SGLang's extras: the output matches a regex, an EBNF grammar or a JSON Schema (one constraint in all,
        # response_format included); the stop string left in the text
        regex: Optional[GrammarT] = None
        ebnf: Optional[GrammarT] = None
        json_schema: Optional[JsonSpecT] = None
        no_stop_trim: bool = False
        # vLLM's: structured_outputs, and its older spellings guided_json / guided_regex / guided_choice /
        # guided_grammar (the same constraints); include_stop_str_in_output (SGLang's no_stop_trim)
        structured_outputs: Optional[StructuredOutputs] = None
        guided_json: Optional[JsonSpecT] = None
        guided_regex: Optional[GrammarT] = None
        guided_choice: Optional[ChoiceT] = None
        guided_grammar: Optional[GrammarT] = None
        include_stop_str_in_output: bool = False
        # vLLM's: each prompt token's logprob, rank and text, with its position's top-k (0: the token alone)
        prompt_logprobs: Optional[LogprobsNumT] = None
        # vLLM's beam search: n beams, ranked by cum_logprob / length ** length_penalty (impl/server/beam_search.py)
        use_beam_search: Optional[bool] = None
        length_penalty: Optional[Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] = None
        # vLLM's prompt handling: the tokenizer's special tokens (completions' default true, chat's false: the template
        # has them), and keeping only truncate_prompt_tokens prompt tokens (-1: as many as the context holds), the
        # last ones (truncation_side "left", the default) or the first
        add_special_tokens: Optional[bool] = None
        truncate_prompt_tokens: Optional[Int(ge=-1, le=I32_MAX)] = None
        truncation_side: Optional[Literal["left", "right"]] = None
        # vLLM's: logprob tokens as "token_id:N"; the response id "cmpl-" / "chatcmpl-" + request_id; session_id (a
        # client's grouping of its requests) changes nothing on one server, as on vLLM's
        return_tokens_as_token_ids: Optional[bool] = None
        # vLLM's: each choice carries its output token ids ("token_ids"; per chunk when streamed) and its prompt's
        return_token_ids: bool = False
        request_id: Optional[RidT] = None
        session_id: Optional[RidT] = None
        # vLLM's / SGLang's: the prefix cache shares this request's prefixes only with requests of the same salt
        cache_salt: Optional[SaltT] = None
        # SGLang's (sglang-router --dp-aware): the --dp-size front sends the request to this rank; a replica, or a
        # server without a front (SGLang's too), serves it where it is
        data_parallel_rank: Optional[Int(ge=0, le=I32_MAX)] = None
        # vLLM's: only these tokens may be sampled; never these words (each as written and after a space)
        allowed_token_ids: Optional[Annotated[list[TokT], Field(min_length=1, max_length=min(lim.vocab_size, 2**18))]] = None
        bad_words: Optional[Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]],
                                      Field(max_length=MAX_BAD_WORDS // 2)]] = None
        # OpenAI fields this server does not implement: only their "unused" value is accepted (and SGLang's and
        # vLLM's in unserved_fields.OPENAI_UNSERVED)
        best_of: Optional[Int(ge=1, le=1)] = None

        @model_validator(mode="before")
        @classmethod
        def _unserved(cls, data: Any) -> Any:
            return refuse_unserved(data, OPENAI_UNSERVED)

        _top_k = field_validator("top_k")(_no_zero_top_k)

        @model_validator(mode="after")
        def _beam_search_fields(self):
            if not self.use_beam_search:
                if self.length_penalty is not None and self.length_penalty != 1.0:
                    raise ValueError("'length_penalty' applies only with use_beam_search: true")
                return self
            if self.stream:
                raise ValueError("beam search is not streamed (as in vLLM); send stream false")
            rf = self.response_format
            set_fields = {
                "temperature": self.temperature not in (None, 0), "top_p": self.top_p not in (None, 1),
                "top_k": self.top_k not in (None, -1), "min_p": self.min_p not in (None, 0),
                "stop": bool(self.stop), "stop_token_ids": bool(self.stop_token_ids),
                "presence_penalty": self.presence_penalty not in (None, 0),
                "frequency_penalty": self.frequency_penalty not in (None, 0),
                "repetition_penalty": self.repetition_penalty not in (None, 1), "min_tokens": self.min_tokens > 0,
                "logit_bias": bool(self.logit_bias), "response_format": rf is not None and rf.type != "text",
                **{k: getattr(self, k) is not None for k in (
                    "regex", "ebnf", "json_schema", "structured_outputs", "guided_json", "guided_regex",
                    "guided_choice", "guided_grammar", "allowed_token_ids", "prompt_logprobs")},
                "bad_words": bool(self.bad_words), "no_stop_trim": self.no_stop_trim,
                # chat only: declared tools; completions only: echo with logprobs (the prompt's are not computed)
                "tools": bool(getattr(self, "tools", None)) and getattr(self, "tool_choice", None) != "none",
                "echo": self.route == "completion" and bool(getattr(self, "echo", False))
                and getattr(self, "logprobs", None) is not None,
            }
            named = [k for k, v in set_fields.items() if v]
            if named:
                raise ValueError(f"'{named[0]}' does not apply to beam search (use_beam_search: it ranks whole "
                                 "sequences by the model's own logprobs, deterministically); remove it")
            return self

        @field_validator("prompt_logprobs", mode="before")
        @classmethod
        def _prompt_lp_all(cls, v: Any) -> Any:
            if v == -1 and type(v) is int:
                raise ValueError(f"-1 (the whole vocabulary) is not served; ask for at most {lim.max_logprobs} "
                                 "(--max-logprobs)")
            return v

        @model_validator(mode="after")
        def _prompt_lp_not_streamed(self):
            if self.prompt_logprobs is not None and self.stream:
                raise ValueError("'prompt_logprobs' are not available when streaming (as in vLLM); send stream false")
            return self

        @field_validator("best_of", mode="before")
        @classmethod
        def _best_of(cls, v: Any) -> Any:
            if v is not None and v != 1:
                raise _unsupported("best_of", "only best_of=1 is served; use n for several choices")
            return v

    class CompletionRequest(_OpenAISampling):
        """POST /v1/completions."""

        route: ClassVar[str] = "completion"

        prompt: Union[TextT, many(TextT), IdsT, many(IdsT)]
        max_tokens: Optional[NewTokensT] = 16
        logprobs: Optional[LogprobsNumT] = None
        # the prompt before each choice's text (and, with logprobs, its tokens' logprobs first; OpenAI's legacy field,
        # what lm-evaluation-harness's local-completions scores with: echo, logprobs 1, max_tokens 1 or 0)
        echo: bool = False
        suffix: Optional[Literal[""]] = None

        @field_validator("suffix", mode="before")
        @classmethod
        def _suffix(cls, v: Any) -> Any:
            if v:
                raise _unsupported("suffix", "insertion is not implemented")
            return v

    class TextPart(_Closed):
        type: Literal["text"]
        text: str

    FuncNameT = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]

    class FunctionDef(_Body):
        name: FuncNameT
        description: Optional[Annotated[str, Field(max_length=GrammarLimits().max_source_bytes)]] = None
        parameters: Optional[dict[str, Any]] = None
        strict: Optional[bool] = None

    class Tool(_Body):
        type: Literal["function"] = "function"
        function: FunctionDef

    class ToolChoiceFunction(_Body):
        name: FuncNameT

    class NamedToolChoice(_Body):
        type: Literal["function"] = "function"
        function: ToolChoiceFunction

    class CalledFunction(_Body):
        name: FuncNameT
        arguments: Union[str, dict[str, Any]] = "{}"

    class MessageToolCall(_Body):
        id: Optional[Annotated[str, Field(max_length=256)]] = None
        type: Literal["function"] = "function"
        function: CalledFunction

    class ChatMessage(_Body):
        role: Literal["system", "developer", "user", "assistant", "tool"]
        content: Union[str, Annotated[list[TextPart], Field(max_length=1024)], None] = None
        name: Optional[str] = None
        tool_calls: Optional[Annotated[list[MessageToolCall], Field(max_length=128)]] = None
        tool_call_id: Optional[Annotated[str, Field(max_length=256)]] = None

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
        # vLLM's and SGLang's: the prompt ends inside the final (assistant) message, for the model to continue it
        continue_final_message: bool = False
        chat_template_kwargs: Optional[TemplateKwargsT] = None
        tools: Optional[Annotated[list[Tool], Field(max_length=128)]] = None
        # vLLM's chat echo: a final assistant message's text starts the answer's content
        echo: Optional[bool] = None

        _kwargs = field_validator("chat_template_kwargs")(_template_kwargs)
        tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
        parallel_tool_calls: Optional[bool] = None
        # the deprecated function-calling fields: use tools / tool_choice
        functions: Optional[Annotated[list[Any], Field(max_length=0)]] = None
        function_call: Optional[Literal["none"]] = None

        @field_validator("functions", mode="before")
        @classmethod
        def _functions(cls, v: Any, info) -> Any:
            if v:
                raise _unsupported(info.field_name, "the deprecated 'functions' field is not served; send 'tools'")
            return v

        @field_validator("function_call", mode="before")
        @classmethod
        def _function_call(cls, v: Any, info) -> Any:
            if v is not None and v != "none":
                raise _unsupported(info.field_name, "the deprecated 'function_call' field is not served; send 'tool_choice'")
            return v

        @model_validator(mode="after")
        def _tool_choice_needs_tools(self):
            tc = self.tool_choice
            names = [t.function.name for t in self.tools or []]
            if len(set(names)) != len(names):
                raise ValueError("'tools' declares a function name twice; give each function its own name")
            if tc == "required" and not names:
                raise ValueError("'tool_choice': 'required' needs at least one function in 'tools'")
            if isinstance(tc, BaseModel) and tc.function.name not in names:
                raise ValueError(f"'tool_choice' names function {tc.function.name!r}, which 'tools' does not declare")
            forced = tc == "required" or isinstance(tc, BaseModel)
            if forced and self.response_format is not None and self.response_format.type != "text":
                raise ValueError("'response_format' cannot be combined with tool_choice 'required' or a named "
                                 "function (both constrain the output); drop one of them")
            return self

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

    class TokenizeRequest(_Body):
        """POST /tokenize (vLLM's): a text, or chat messages rendered by the chat template."""

        model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]})

        model: Optional[str] = None
        prompt: Optional[str] = None
        messages: Optional[Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]] = None
        # vLLM's defaults: a text gets the tokenizer's special tokens (Gemma's bos), messages their template's only
        add_special_tokens: Optional[bool] = None
        add_generation_prompt: bool = True
        continue_final_message: bool = False
        chat_template_kwargs: Optional[TemplateKwargsT] = None
        return_token_strs: bool = False

        _kwargs = field_validator("chat_template_kwargs")(_template_kwargs)

        @model_validator(mode="after")
        def _one_input(self) -> "TokenizeRequest":
            if (self.prompt is None) == (self.messages is None):
                raise ValueError("give exactly one of 'prompt' (a text) or 'messages' (a conversation)")
            return self

    class DetokenizeRequest(_Body):
        """POST /detokenize (vLLM's): token ids -> their text (special tokens kept)."""

        model: Optional[str] = None
        tokens: list[TokT]

    class ResponseTextFormat(_Body):
        type: Literal["text", "json_object", "json_schema"] = "text"
        name: Optional[Annotated[str, Field(max_length=256)]] = None
        schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
        strict: Optional[bool] = None
        description: Optional[str] = None

        model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    class ResponseText(_Body):
        format: Optional[ResponseTextFormat] = None

    class ResponseTool(_Body):
        type: Literal["function"]
        name: FuncNameT
        description: Optional[Annotated[str, Field(max_length=GrammarLimits().max_source_bytes)]] = None
        parameters: Optional[dict[str, Any]] = None
        strict: Optional[bool] = None

    class ResponseToolChoice(_Body):
        type: Literal["function"]
        name: FuncNameT

    class ResponsesRequest(_Body):
        """POST /v1/responses (OpenAI's Responses API): ``input`` (a text, or message and function-call
        items, ``impl/server/responses_api.py`` reads them) answered through the chat path."""

        model: Optional[str] = None
        input: Union[TextT, Annotated[list[dict[str, Any]], Field(min_length=1, max_length=4096)]]
        instructions: Optional[str] = None
        max_output_tokens: Optional[Int(ge=1, le=I32_MAX)] = None
        temperature: Optional[Sampling("temperature")] = None
        top_p: Optional[Sampling("top_p")] = None
        stream: bool = False
        tools: Optional[Annotated[list[ResponseTool], Field(max_length=128)]] = None
        tool_choice: Union[Literal["none", "auto", "required"], ResponseToolChoice, None] = None
        parallel_tool_calls: Optional[bool] = None
        text: Optional[ResponseText] = None
        metadata: Optional[Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                                     Field(max_length=16)]] = None
        user: Optional[str] = None
        # stored unless false (OpenAI's default; impl/server/response_store.py); a stored response to continue
        store: Optional[bool] = None
        previous_response_id: Optional[Annotated[str, Field(min_length=1, max_length=256)]] = None
        # answered at once, generated without the client (impl/server/background_responses.py); needs the store
        background: Optional[bool] = None
        # not served: only their unused values pass
        reasoning: Optional[Any] = None
        # the output text's logprobs, each token with its top_logprobs most likely ones (OpenAI's include entry)
        include: Optional[Annotated[list[Literal["message.output_text.logprobs"]], Field(max_length=1)]] = None
        top_logprobs: Optional[LogprobsNumT] = None
        # "auto": the oldest items dropped until the input fits the context (responses_api.truncated)
        truncation: Optional[Literal["disabled", "auto"]] = None
        conversation: Optional[Any] = None
        prompt: Optional[Any] = None

        _conversation = _only_unused("conversation", "conversation objects are not served; continue a stored "
                                                     "response with previous_response_id, or send the conversation "
                                                     "as input")
        _reasoning = _only_unused("reasoning", "Gemma-4's template switches thinking with its own variable; use "
                                               "/v1/chat/completions with chat_template_kwargs")
        _prompt = _only_unused("prompt", "stored prompts are not served; send the input")

        @model_validator(mode="after")
        def _named_tool_declared(self):
            tc = self.tool_choice
            if tc is not None and not isinstance(tc, str) and tc.name not in {t.name for t in self.tools or []}:
                raise ValueError(f"'tool_choice' names function {tc.name!r}, which 'tools' does not declare")
            return self

    return RequestModels(SamplingParamsBody, GenerateRequest, CompletionRequest, ChatCompletionRequest, AbortRequest,
                         TokenizeRequest, DetokenizeRequest, ResponsesRequest)


DEFAULT_MODELS = request_models(RequestLimits())
GenerateRequest = DEFAULT_MODELS.generate
CompletionRequest = DEFAULT_MODELS.completion
ChatCompletionRequest = DEFAULT_MODELS.chat
AbortRequest = DEFAULT_MODELS.abort
TokenizeRequest = DEFAULT_MODELS.tokenize
DetokenizeRequest = DEFAULT_MODELS.detokenize
