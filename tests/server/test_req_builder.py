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
