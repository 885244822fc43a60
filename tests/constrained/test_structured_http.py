"""Structured outputs and tool calls over HTTP (the shared tiny-model server of tests/server), with the real
``openai`` client where a client would use it."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import jsonschema
import openai
import pytest

from contracts.http_support import ARGV_OFF

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "n"]}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url() -> str:
    from contracts.adapters.impl_http import base_url

    return base_url(ARGV_OFF)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def test_openai_response_format_json_schema(client, model):
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=40, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"


def test_completions_response_format_and_json_object(url, model):
    body = {"model": model, "prompt": "Answer:", "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}
    jsonschema.validate(json.loads(_post(url, "/v1/completions", body).json()["choices"][0]["text"]), SCHEMA)
    r = _post(url, "/v1/completions", {**body, "max_tokens": 8, "response_format": {"type": "json_object"}})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("{")


@pytest.mark.parametrize("sp,check", [
    ({"json_schema": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    ({"regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t) or pytest.fail(t)),
    ({"ebnf": 'root ::= "<" [a-c]+ ">"'}, lambda t: re.fullmatch(r"<[a-c]+>", t) or pytest.fail(t)),
])
def test_generate_json_schema_regex_ebnf(url, sp, check):
    r = _post(url, "/generate", {"text": "hello", "sampling_params": {"temperature": 0, "max_new_tokens": 40, **sp}})
    assert r.status_code == 200, r.text
    check(r.json()["text"])


def test_generate_streams_constrained_text(url):
    body = {"text": "hello", "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 40,
                                                                  "json_schema": json.dumps(SCHEMA)}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    jsonschema.validate(json.loads(events[-1]["text"]), SCHEMA)


def test_logit_bias_on_both_apis(url, model):
    tok = _post(url, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}).json()
    target = 70  # any id of the tiny vocabulary
    g = _post(url, "/generate", {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 3,
                                                                    "logit_bias": {str(target): 100}}}).json()
    assert g["output_ids"] == [target] * 3, (g, tok)
    c = _post(url, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 3, "temperature": 0,
                                       "logit_bias": {str(target): 100}, "return_token_ids": True}).json()
    assert c["choices"][0]["token_ids"] == [target] * 3


@pytest.mark.parametrize("sp,field", [
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "sampling_params"),
    ({"regex": "((("}, "regex"),
    ({"json_schema": "{"}, "json_schema"),
    ({"ebnf": "root ::= nope"}, "ebnf"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ({"regex": "a", "min_new_tokens": 2}, "min_new_tokens"),
])
def test_bad_native_fields_are_400_naming_the_field(url, sp, field):
    r = _post(url, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, **sp}})
    err = r.json()["error"]
    assert r.status_code == 400 and field in err["param"] + err["message"], r.text


def test_tool_call_round_trip_with_the_openai_client(client, model):
    r = client.chat.completions.create(model=model, messages=MSGS, tools=[WEATHER, CLOCK], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name in ("get_weather", "now") and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        jsonschema.validate(args, WEATHER["function"]["parameters"])
    # the result goes back through the chat template; the model answers (or calls again)
    follow = MSGS + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})}]
    r2 = client.chat.completions.create(model=model, messages=follow, tools=[WEATHER, CLOCK], max_tokens=8, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the same conversation with tool_choice "none" renders too, and nothing is parsed
    r3 = client.chat.completions.create(model=model, messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=4)
    assert r3.choices[0].message.tool_calls is None


def test_named_tool_choice_streams_the_call_as_a_delta(client, model):
    chunks = list(client.chat.completions.create(
        model=model, messages=MSGS, tools=[WEATHER, CLOCK], stream=True, parallel_tool_calls=False, max_tokens=60,
        temperature=0, tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["get_weather"] and calls[0].index == 0
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER["function"]["parameters"])
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason]
    assert finals == ["tool_calls"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)


def test_streamed_and_non_streamed_tool_calls_agree(client, model):
    kw = dict(model=model, messages=MSGS, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
              max_tokens=120, temperature=0)
    message = client.chat.completions.create(**kw).choices[0].message
    assert message.tool_calls, message
    whole = message.tool_calls[0].function
    streamed = [tc for ch in client.chat.completions.create(stream=True, **kw)
                for tc in (ch.choices[0].delta.tool_calls or [])]
    assert (streamed[0].function.name, streamed[0].function.arguments) == (whole.name, whole.arguments)


def _deep(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


HOSTILE = [
    {"json_schema": json.dumps(_deep(300))},
    {"json_schema": json.dumps({"enum": list(range(20000))})},
    {"json_schema": json.dumps({"type": "string", "description": "x" * 2**20})},
    {"regex": "(a|b)*c{99999}"},
    {"regex": "[" * 5000},
]


def test_hostile_grammars_get_a_quick_400_and_never_stall_other_requests(url):
    """A normal request streams while hostile grammars are refused; its tokens keep coming."""
    stamps: list[float] = []

    def normal() -> None:
        body = {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}
        with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.perf_counter())

    t = threading.Thread(target=normal)
    t.start()
    for sp in HOSTILE:
        t0 = time.perf_counter()
        r = _post(url, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, **sp}})
        assert r.status_code in (400, 413), r.text[:300]
        assert time.perf_counter() - t0 < 5.0, sp.keys()
    t.join(120)
    assert len(stamps) == 60
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert max(gaps) < 5.0, f"a decode step waited {max(gaps):.1f} s"
