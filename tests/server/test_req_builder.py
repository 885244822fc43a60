"""The engine's refusals become 400s naming the route's own field (impl/server/req_builder.py), without a server."""

from __future__ import annotations

import pytest
import torch

from impl.engine.intake import IntakePolicy, InvalidRequest, expand_requests
from impl.server.errors import APIError
from impl.server.req_builder import _OPENAI_NAMES, _named

POLICY = IntakePolicy(max_req_len=64, vocab_size=256)


def _refusal(sampling: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        expand_requests([[1, 2, 3]], sampling, policy=POLICY, seed_generator=torch.Generator())
    return e.value


@pytest.mark.parametrize("sampling,field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens"),
    ({"n": 0}, "n"),
])
def test_a_sampling_refusal_names_its_field(sampling, field):
    e = _refusal(sampling)
    assert (e.field, e.sampling_field) == ("sampling_params", field)


def test_unknown_sampling_fields_name_the_params_as_a_whole():
    e = _refusal({"nope": 1})
    assert (e.field, e.sampling_field) == ("sampling_params", None)


def _api_error(e: InvalidRequest, prompt_field: str, renames: dict[str, str] | None) -> APIError:
    with pytest.raises(APIError) as got, _named(prompt_field, renames):
        raise e
    return got.value


def test_openai_routes_name_the_renamed_sampling_field():
    err = _api_error(_refusal({"max_new_tokens": -1}), "prompt", _OPENAI_NAMES)
    assert err.status == 400 and err.param == "max_tokens"
    assert err.message.startswith("max_tokens must be at least 0")
    err = _api_error(_refusal({"min_new_tokens": 9, "max_new_tokens": 4}), "messages",
                     {"max_new_tokens": "max_completion_tokens", "min_new_tokens": "min_tokens"})
    assert err.param == "min_tokens" and "[0, max_completion_tokens]" in err.message


def test_generate_names_sampling_params_and_the_prompt_field():
    err = _api_error(_refusal({"temperature": -1.0}), "text", None)
    assert err.param == "sampling_params" and err.message.startswith("'sampling_params': temperature")
    err = _api_error(InvalidRequest("the prompt is empty", "input_ids"), "prompt", _OPENAI_NAMES)
    assert err.param == "prompt" and err.message == "'prompt': the prompt is empty"


def test_chat_template_kwargs_reach_the_template_and_reserved_names_are_400():
    """SGLang's / vLLM's chat_template_kwargs: extra template variables (a template's enable_thinking), on chat and
    /tokenize alike; the variables the server binds (messages, tools, bos_token, ...) cannot be replaced."""
    from pydantic import ValidationError

    from impl.server.protocol import ChatCompletionRequest, TokenizeRequest
    from impl.server.req_builder import from_chat, tokenize
    from tests.helpers.engines import engine

    eng = engine("e2b")
    template = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if enable_thinking %}<think>{% endif %}")
    msgs = [{"role": "user", "content": "Hi"}]
    think = tokenize(eng, TokenizeRequest.model_validate({"messages": msgs, "chat_template_kwargs": {"enable_thinking": True}}),
                     template)[0]
    plain = tokenize(eng, TokenizeRequest.model_validate({"messages": msgs}), template)[0]
    assert eng.tokenizer.decode(think, False) == "<bos>Hi<think>" and eng.tokenizer.decode(plain, False) == "<bos>Hi"
    body = ChatCompletionRequest.model_validate({"messages": msgs, "max_tokens": 1,
                                                 "chat_template_kwargs": {"enable_thinking": True}})
    assert from_chat(eng, body, template).reqs[0].origin_input_ids == think
    for bad in ({"tools": []}, {"bos_token": "x"}, {"no-dash": 1}, {f"k{i}": i for i in range(33)}, {"template": 1},
                {"chat_template": 1}, {"self": 1}, {"continue_final_message": True}):  # (the last: the calls' names)
        with pytest.raises(ValidationError, match="chat_template_kwargs"):
            ChatCompletionRequest.model_validate({"messages": msgs, "chat_template_kwargs": bad})
