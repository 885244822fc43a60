"""POST /v1/responses through the official openai client: the chat path's answer as Responses output items and
events, function calls both ways, stored responses continued, read and deleted, and the features not served
refused."""

from __future__ import annotations

import json

import pytest

import httpx
import openai

from contracts.http_support import openai_client, post

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}
GREEDY = {"temperature": 0.0}


def get(url, path):
    return httpx.get(url + path, timeout=30)


@pytest.fixture(scope="module")
def client(url):
    return openai_client(url)


def _chat(url, messages, **extra):
    r = post(url, "/v1/chat/completions", {"messages": messages, **GREEDY, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_text_input_answers_as_chat_does(url, client):
    r = client.responses.create(model="default", input="The sea is", instructions="Answer briefly",
                                max_output_tokens=6, **GREEDY)
    chat = _chat(url, [{"role": "system", "content": "Answer briefly"}, {"role": "user", "content": "The sea is"}],
                 max_tokens=6)
    assert r.output_text == chat["choices"][0]["message"]["content"] and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"] and r.usage.output_tokens == 6
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    # message items with text parts, a developer message as a system one
    items = [{"role": "developer", "content": "Answer briefly"},
             {"role": "user", "content": [{"type": "input_text", "text": "The sea is"}]}]
    assert client.responses.create(model="default", input=items, max_output_tokens=6, **GREEDY).output_text == \
        r.output_text


def test_streamed_events_build_the_same_answer(client):
    kw = dict(model="default", input="A cat", max_output_tokens=8, **GREEDY)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 8


def test_logprobs_when_included(url, client):
    """include ["message.output_text.logprobs"]: the text part carries chat's logprob entries (each with its
    top_logprobs most likely tokens), streamed deltas too, the same as chat's."""
    kw = dict(model="default", input="The sea is", max_output_tokens=5, top_logprobs=2,
              include=["message.output_text.logprobs"], **GREEDY)
    r = client.responses.create(**kw)
    chat = _chat(url, [{"role": "user", "content": "The sea is"}], max_tokens=5, logprobs=True, top_logprobs=2)
    want = chat["choices"][0]["logprobs"]["content"]
    got = r.output[0].content[0].logprobs
    # (the same numbers up to float32 rounding: a cached prompt prefix changes the matmuls' row counts)
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in got] == \
        [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in want] and len(want) == 5
    assert [e.logprob for e in got] == pytest.approx([e["logprob"] for e in want], abs=1e-5)
    events = list(client.responses.create(stream=True, **kw))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [e.logprob for e in streamed] == pytest.approx([e["logprob"] for e in want], abs=1e-5)
    final = events[-1].response.output[0].content[0].logprobs
    assert [e.model_dump() for e in final] == [e.model_dump() for e in streamed]  # the deltas' entries, all of them
    plain = client.responses.create(model="default", input="The sea is", max_output_tokens=5, **GREEDY)
    assert not plain.output[0].content[0].logprobs


def test_function_calls_out_and_back(client):
    kw = dict(model="default", input="What is the weather in Paris?", tools=[WEATHER, CLOCK], tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=60, **GREEDY)
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name in ("get_weather", "now") and r.status == "completed", r.output
    assert isinstance(json.loads(calls[0].arguments), dict) and calls[0].call_id.startswith("call_")
    streamed = list(client.responses.create(stream=True, **kw))
    done = [e.item for e in streamed if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(calls[0].name, calls[0].arguments)]
    assert [e.arguments for e in streamed if e.type == "response.function_call_arguments.done"] == [calls[0].arguments]
    # the call and its output go back as input items
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
               "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temp_c": 21})}]
    again = client.responses.create(model="default", input=follow, tools=[WEATHER, CLOCK], max_output_tokens=4, **GREEDY)
    assert again.status in ("completed", "incomplete") and again.usage.input_tokens > r.usage.input_tokens


def test_json_format_and_refusals(url):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = post(url, "/v1/responses", {"input": "x", "max_output_tokens": 4, **GREEDY,
                                    "text": {"format": {"type": "json_schema", "name": "t", "schema": schema}}})
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"].startswith("{"), r.text
    for body, field in (({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"input": "x", "previous_response_id": 5}, "previous_response_id"),
                        ({"input": "x", "conversation": "conv_1"}, "conversation"),
                        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
                        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
                         "input[0].content[0]"),
                        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
                        ({"input": [{"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"}]},
                         "input[0].call_id"),
                        ({"input": "x", "stream": True, "max_output_tokens": 0}, "max_output_tokens"),
                        ({"input": "x", "model": "other-model"}, "model"),
                        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
                        ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
                        ({"input": "x", "truncation": "middle"}, "truncation")):
        r = post(url, "/v1/responses", body)
        assert r.status_code in (400, 404) and field in r.text, (body, r.text)
    assert post(url, "/v1/responses", {"input": "x", "store": False, "max_output_tokens": 1}).status_code == 200


def test_previous_response_id_continues_the_stored_conversation(client):
    """A follow-up by previous_response_id answers as the whole conversation sent as input does (the earlier
    input and output, not the earlier instructions); GET returns the stored object, input_items its input."""
    first = client.responses.create(model="default", input="The sea is", instructions="Answer briefly",
                                    max_output_tokens=5, **GREEDY)
    assert first.store is True and first.previous_response_id is None
    follow = client.responses.create(model="default", input="And the sky?", previous_response_id=first.id,
                                     instructions="Be kind", max_output_tokens=5, **GREEDY)
    whole = client.responses.create(model="default", instructions="Be kind", max_output_tokens=5, store=False,
                                    input=[{"role": "user", "content": "The sea is"},
                                           {"role": "assistant", "content": first.output_text},
                                           {"role": "user", "content": "And the sky?"}], **GREEDY)
    assert follow.output_text == whole.output_text and follow.previous_response_id == first.id
    assert follow.usage.input_tokens == whole.usage.input_tokens > first.usage.input_tokens
    assert whole.store is False
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    items = client.responses.input_items.list(follow.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "And the sky?")]
    # a chain: the third sees both earlier turns
    third = client.responses.create(model="default", input="Why?", previous_response_id=follow.id,
                                    max_output_tokens=2, **GREEDY)
    assert third.usage.input_tokens > follow.usage.input_tokens


def test_stored_responses_read_list_and_delete(url, client):
    items = [{"role": ("user", "assistant")[k % 2], "content": f"turn {k}"} for k in range(5)]
    r = client.responses.create(model="default", input=items, max_output_tokens=1, **GREEDY)
    page = get(url, f"/v1/responses/{r.id}/input_items?limit=2&order=asc").json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["turn 0", "turn 1"] and page["has_more"] is True
    rest = get(url, f"/v1/responses/{r.id}/input_items?order=asc&after={page['last_id']}").json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["turn 2", "turn 3", "turn 4"]
    assert rest["has_more"] is False and rest["first_id"] == rest["data"][0]["id"]
    newest = get(url, f"/v1/responses/{r.id}/input_items").json()  # newest first by default
    assert [i["content"][0]["text"] for i in newest["data"]] == [f"turn {k}" for k in range(4, -1, -1)]
    for query, field in (("limit=0", "limit"), ("order=up", "order"), ("after=msg_nope", "after")):
        bad = get(url, f"/v1/responses/{r.id}/input_items?{query}")
        assert bad.status_code == 400 and field in bad.text, (query, bad.text)
    # streamed: stored as the last event's response, before that event is sent
    events = list(client.responses.create(model="default", input="A cat", max_output_tokens=3, stream=True,
                                          **GREEDY))
    assert client.responses.retrieve(events[-1].response.id).model_dump() == events[-1].response.model_dump()
    # not stored, deleted, unknown: 404s naming the id
    off = client.responses.create(model="default", input="x", max_output_tokens=1, store=False, **GREEDY)
    gone = httpx.delete(f"{url}/v1/responses/{r.id}", timeout=30)
    assert gone.status_code == 200 and gone.json() == {"id": r.id, "object": "response", "deleted": True}
    for rid in (off.id, r.id, "resp_unknown"):
        for resp in (get(url, f"/v1/responses/{rid}"), get(url, f"/v1/responses/{rid}/input_items"),
                     httpx.delete(f"{url}/v1/responses/{rid}", timeout=30),
                     post(url, "/v1/responses", {"input": "x", "previous_response_id": rid})):
            err = resp.json()["error"]
            assert resp.status_code == 404 and rid in err["message"] and "stores responses" in err["message"], resp.text
    info = get(url, "/get_server_info").json()["responses_store"]
    assert info["responses"] >= 1 and 0 < info["bytes"] <= info["budget_bytes"] == 256 << 20


def test_function_call_output_continues_a_stored_call(client):
    """The call a stored response made goes back as a function_call_output only: the follow-up sees the call."""
    kw = dict(model="default", tools=[WEATHER, CLOCK], max_output_tokens=4, **GREEDY)
    r = client.responses.create(input="What is the weather in Paris?", tool_choice="required",
                                parallel_tool_calls=False, **{**kw, "max_output_tokens": 60})
    (call,) = [o for o in r.output if o.type == "function_call"]
    out = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 21})}
    follow = client.responses.create(input=[out], previous_response_id=r.id, **kw)
    whole = client.responses.create(input=[{"role": "user", "content": "What is the weather in Paris?"},
                                           {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                            "arguments": call.arguments}, out], store=False, **kw)
    assert follow.output_text == whole.output_text and follow.usage.input_tokens == whole.usage.input_tokens


def test_a_server_without_a_store_refuses_store_true(hardened_url):
    """YOCO_RESPONSES_STORE_MB=0 (the hardened server): store true is a 400, a default request is answered
    unstored."""
    r = post(hardened_url, "/v1/responses", {"input": "x", "store": True, "max_output_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "store" and "YOCO_RESPONSES_STORE_MB=0" in r.text
    r = post(hardened_url, "/v1/responses", {"input": "x", "max_output_tokens": 1})
    assert r.status_code == 200 and r.json()["store"] is False, r.text
    gone = get(hardened_url, f"/v1/responses/{r.json()['id']}")
    assert gone.status_code == 404 and "stores no responses" in gone.text
    bg = post(hardened_url, "/v1/responses", {"input": "x", "background": True, "max_output_tokens": 1})
    assert bg.status_code == 400 and bg.json()["error"]["param"] == "background" and "STORE_MB=0" in bg.text, bg.text


def test_truncation_auto_drops_the_oldest_turns(client):
    """truncation "auto": the oldest turns dropped, whole, as few as let the input fit the context (512 tokens on
    this server): the answer is the one to the conversation from that turn on; "disabled" (the default) refuses."""
    items = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "the sea " * 400},
             {"role": "user", "content": "The sky is"}, {"role": "assistant", "content": "blue"},
             {"role": "user", "content": "And the sea?"}]
    kw = dict(model="default", max_output_tokens=4, **GREEDY)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(input=items, **kw)
    r = client.responses.create(input=items, truncation="auto", **kw)
    cut = client.responses.create(input=items[2:], store=False, **kw)
    assert r.output_text == cut.output_text and r.usage.input_tokens == cut.usage.input_tokens
    assert r.truncation == "auto" and cut.truncation == "disabled"
    # the stored conversation stays whole: a follow-up is cut again
    f = client.responses.create(input="Why?", previous_response_id=r.id, truncation="auto", **kw)
    assert f.usage.input_tokens > r.usage.input_tokens


def _sse_events(resp) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in resp.text.splitlines() if line.startswith("data: ")]


def _until_finished(url, rid, timeout_s=60.0):
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = get(url, f"/v1/responses/{rid}").json()
        if r["status"] not in ("queued", "in_progress"):
            return r
        time.sleep(0.05)
    raise AssertionError(f"background response {rid} still {r['status']} after {timeout_s} s")


def test_background_response_generates_without_the_client(url, client):
    """background true: answered at once as queued; GET follows it to the answer the foreground request gets; its
    events (the streamed foreground's, created as queued) replay by GET ?stream=true from any sequence number."""
    kw = dict(model="default", input="The sea is", max_output_tokens=8, **GREEDY)
    fg = client.responses.create(**kw)
    r = client.responses.create(background=True, **kw)
    assert r.status == "queued" and r.background is True and r.output == [] and fg.background is False
    done = _until_finished(url, r.id)
    assert done["status"] == "incomplete" and done["background"] is True and done["usage"]["output_tokens"] == 8
    assert client.responses.retrieve(r.id).output_text == fg.output_text
    events = _sse_events(get(url, f"/v1/responses/{r.id}?stream=true"))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"] == done
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == fg.output_text
    later = _sse_events(get(url, f"/v1/responses/{r.id}?stream=true&starting_after=3"))
    assert later == events[4:]
    items = client.responses.input_items.list(r.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]
    follow = client.responses.create(**{**kw, "input": "And the sky?", "max_output_tokens": 2},
                                     previous_response_id=r.id)
    assert follow.previous_response_id == r.id and follow.usage.input_tokens > fg.usage.input_tokens


def test_background_stream_resumes_after_the_client_leaves(url):
    """background with stream: the events as they come; a client that leaves does not stop the response, and
    GET ?stream=true&starting_after=N gives the rest (the two parts are the whole, in order)."""
    body = {"input": "A cat", "max_output_tokens": 12, "background": True, "stream": True, **GREEDY}
    first: list[dict] = []
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=60) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data: "):
                first.append(json.loads(line[len("data: "):]))
            if len(first) == 3:
                break  # the client leaves
    rid = first[0]["response"]["id"]
    assert first[0]["response"]["background"] is True
    done = _until_finished(url, rid)
    assert done["usage"]["output_tokens"] == 12
    rest = _sse_events(get(url, f"/v1/responses/{rid}?stream=true&starting_after={first[-1]['sequence_number']}"))
    whole = first + rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[-1]["type"] == "response.incomplete" and whole[-1]["response"]["output"] == done["output"]


def test_background_responses_queue_and_cancel(url, client):
    """While generation is paused a background response stays queued (GET says so); cancel ends it as cancelled
    (a second cancel answers it as it stands), its stream ends without a terminal event; a foreground response
    cannot be cancelled, an unknown one is a 404; a running one cannot be continued yet."""
    assert post(url, "/pause_generation", {"mode": "in_place"}).status_code == 200
    try:
        r = client.responses.create(model="default", input="The sea is", max_output_tokens=50, background=True,
                                    **GREEDY)
        assert get(url, f"/v1/responses/{r.id}").json()["status"] == "queued"
        busy = post(url, "/v1/responses", {"input": "x", "previous_response_id": r.id})
        assert busy.status_code == 400 and "still running" in busy.text and \
            busy.json()["error"]["param"] == "previous_response_id", busy.text
        c = post(url, f"/v1/responses/{r.id}/cancel", {})
        assert c.status_code == 200 and c.json()["status"] == "cancelled" and c.json()["output"] == [], c.text
    finally:
        assert post(url, "/continue_generation", {}).status_code == 200
    assert client.responses.retrieve(r.id).status == "cancelled"
    again = post(url, f"/v1/responses/{r.id}/cancel", {})
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    events = _sse_events(get(url, f"/v1/responses/{r.id}?stream=true"))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress"]
    fg = client.responses.create(model="default", input="x", max_output_tokens=1, **GREEDY)
    for rid, code, text in ((fg.id, 400, "only background responses"), ("resp_unknown", 404, "not found")):
        bad = post(url, f"/v1/responses/{rid}/cancel", {})
        assert bad.status_code == code and text in bad.text, bad.text
    bad = get(url, f"/v1/responses/{fg.id}?stream=true")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream", bad.text
    bad = get(url, f"/v1/responses/{r.id}?stream=true&starting_after=-2")
    assert bad.status_code == 400 and "starting_after" in bad.text, bad.text
    refused = post(url, "/v1/responses", {"input": "x", "background": True, "store": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "background", refused.text
    assert get(url, "/get_server_info").json()["responses_store"]["background_running"] == 0
