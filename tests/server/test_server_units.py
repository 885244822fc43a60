"""Server pieces that need no running server: metrics text, stream text holdback, error field names."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from impl.server.errors import validation_message
from impl.engine.detokenizer_stage import hold_stop_prefix
from impl.engine.load import LoadView
from impl.server.metrics import Gauges, ServerMetrics, parse_metrics
from impl.server.protocol import ChatCompletionRequest, GenerateRequest
from impl.server.streaming import json_safe, sse


def _metrics() -> ServerMetrics:
    load = LoadView(num_running_reqs=2, num_waiting_reqs=1, kv_tokens_total=400, kv_tokens_available=300,
                    max_running_requests=8, chunked_prefill_size=64, max_prefill_tokens=256, max_req_len=128)
    gauges = Gauges(lambda: load, lambda: {"forwards": 7, "skipped_cross_decoder_rows": 40})
    return ServerMetrics('tiny "e2b"', gauges)


def test_metrics_counts_and_histograms():
    m = _metrics()
    m.observe_finished(prompt_tokens=10, completion_tokens=5, cached_tokens=4, aborted=False, ttft=0.03, e2e=0.43)
    m.observe_finished(prompt_tokens=6, completion_tokens=1, cached_tokens=0, aborted=True, ttft=None, e2e=0.01)
    text = m.render()
    got = parse_metrics(text)
    lab = 'model_name="tiny \\"e2b\\""'
    assert got[f"sglang:prompt_tokens_total{{{lab}}}"] == 16
    assert got[f"sglang:generation_tokens_total{{{lab}}}"] == 6
    assert got[f"sglang:num_aborted_requests_total{{{lab}}}"] == 1
    assert got[f"sglang:cache_hit_rate{{{lab}}}"] == pytest.approx(4 / 16)
    assert got[f"sglang:num_running_reqs{{{lab}}}"] == 2 and got[f"sglang:num_queue_reqs{{{lab}}}"] == 1
    assert got[f"sglang:token_usage{{{lab}}}"] == pytest.approx(0.25)
    assert got[f"yoco:skipped_cross_decoder_rows_total{{{lab}}}"] == 40
    # histograms are cumulative and end with +Inf == count
    assert got[f'sglang:time_to_first_token_seconds_bucket{{{lab},le="0.02"}}'] == 0
    assert got[f'sglang:time_to_first_token_seconds_bucket{{{lab},le="0.04"}}'] == 1
    assert got[f'sglang:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}}'] == 2
    assert got[f"sglang:e2e_request_latency_seconds_count{{{lab}}}"] == 2
    assert got[f"sglang:time_per_output_token_seconds_sum{{{lab}}}"] == pytest.approx(0.1)  # (0.43 - 0.03) / 4
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text


@pytest.mark.parametrize(
    "text,stops,want",
    [
        ("hello wor", ["world"], "hello "),  # a stop string may be starting: hold it back
        ("abc", ["x"], "abc"),
        ("xab", ["abx", "b"], "x"),  # the longest held-back prefix wins
        ("", ["a"], ""),
    ],
)
def test_hold_stop_prefix(text, stops, want):
    assert hold_stop_prefix(text, stops) == want


def test_sse_event_is_one_line_for_splitlines_clients():
    """httpx's iter_lines splits like str.splitlines(): U+0085 / U+2028 / U+2029 in a token's text (a
    random-weight model emits them) must stay escaped, or the client reads half an event."""
    import json

    text = "a\x85b\u2028c\u2029d\ne\u00e9"
    event = sse({"text": text}).decode("utf-8")
    lines = event.splitlines()
    assert lines[0].startswith("data: ") and lines[1:] == [""]
    assert json.loads(lines[0][len("data: "):])["text"] == text


def test_json_safe_replaces_non_finite():
    assert json_safe({"a": [float("-inf"), 1.5, (float("inf"),)], "b": float("nan")}) == {"a": [-9999.0, 1.5, [9999.0]], "b": None}


def _err(model, data) -> tuple[str, str]:
    with pytest.raises(ValidationError) as e:
        model.model_validate(data)
    return validation_message(e.value)


def test_validation_names_the_field():
    assert _err(GenerateRequest, {"text": 5})[0] == "text"
    assert _err(GenerateRequest, {"input_ids": [1, "a"]})[0] == "input_ids[1]"
    assert _err(GenerateRequest, {"stream": "yes"})[0] == "stream"
    field, msg = _err(ChatCompletionRequest, {"messages": [{"content": "hi"}]})
    assert field == "messages[0].role" and "required" in msg
    assert _err(ChatCompletionRequest, {"messages": [{"role": "user"}], "max_tokens": True})[0] == "max_tokens"


def test_token_ids_past_the_vocabulary_are_named_not_the_batch_limit():
    """A prompt of 512 token ids with one past a 512-token vocabulary: the union's batch-of-strings branch only
    reports its length (512 > --max-batch-size), the branch the client meant names the id; the message says so
    (it named --max-batch-size). A batch really too long still names its flag."""
    from impl.server.limits import RequestLimits
    from impl.server.protocol import request_models

    completion = request_models(RequestLimits(vocab_size=512)).completion
    field, msg = _err(completion, {"model": "m", "prompt": [2] + [100 + j for j in range(511)]})
    assert field == "prompt[413]" and "token id 512 is outside the vocabulary (ids 0 to 511)" in msg, msg
    field, msg = _err(completion, {"model": "m", "prompt": [[1, 2], [3, 600]]})
    assert field == "prompt[1][1]" and "token id 600" in msg and "--max-batch-size" not in msg, msg
    field, msg = _err(completion, {"model": "m", "prompt": ["a"] * 65})
    assert field == "prompt" and "--max-batch-size" in msg, msg


def test_request_stream_drains_output_emitted_before_waiting():
    """Output queued before the consumer waits is seen without any wake-up."""
    from impl.engine.output import ReqOutput, SGLangDicts
    from impl.engine.req import FinishReason
    from impl.engine.request_handle import RequestHandle
    from impl.server.async_engine import RequestStream

    handle = RequestHandle(req=None, stream=True)  # type: ignore[arg-type]
    common = dict(rid="r", prompt_tokens=3, cached_tokens=0, e2e_latency=0.1)
    handle.queue.put(ReqOutput(text="a", text_delta="a", output_ids_delta=[5], finish_reason=None, completion_tokens=1,
                               **common))
    handle.queue.put(ReqOutput(text="ab", text_delta="b", output_ids_delta=[6], finish_reason=FinishReason("length", length=2),
                               completion_tokens=2, **common))

    async def run():
        s, dicts = RequestStream(handle=handle), SGLangDicts()
        return [dicts.add(o) async for o in s.outputs()], s.final

    outs, final = asyncio.run(run())
    assert [o["text"] for o in outs] == ["a", "ab"] and [o["output_ids"] for o in outs] == [[5], [5, 6]]
    assert final.text == "ab" and outs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


def test_response_store_drops_the_least_recently_used_within_its_budget():
    from impl.server.response_store import ResponseStore, StoredResponse

    def entry(rid: str, text: str = "x" * 100) -> StoredResponse:
        return StoredResponse.of({"id": rid, "output": text}, [], [{"role": "user", "content": text}])

    size = entry("a").nbytes
    store = ResponseStore(3 * size)
    for rid in "abc":
        assert store.put(entry(rid))
    assert store.get("a") is not None  # now the most recently used: b goes first
    assert store.put(entry("d"))
    assert store.get("b") is None and all(store.get(r) is not None for r in "acd")
    assert store.stats() == {"responses": 3, "bytes": 3 * size, "budget_bytes": 3 * size, "dropped": 1}
    assert not store.put(entry("big", "y" * 1000)) and store.stats()["responses"] == 3  # larger than the budget
    assert store.put(entry("c", "")) and store.used == 2 * size + entry("c", "").nbytes  # replaced, not added
    assert store.delete("a") and not store.delete("a") and store.get("a") is None
    store.check_integrity()
    store.used += 1  # a miscount is caught
    with pytest.raises(AssertionError, match="counted"):
        store.check_integrity()
    assert "dropped 1 for room" in store.not_found("b") and "'b'" in store.not_found("b")
    assert "stores no responses" in ResponseStore(0).not_found("b") and not ResponseStore(0).enabled
    with pytest.raises(ValueError, match=">= 0"):
        ResponseStore(-1)


def test_response_store_budget_comes_from_the_environment(monkeypatch):
    from impl.server.response_store import ResponseStore

    monkeypatch.setenv("YOCO_RESPONSES_STORE_MB", "3")
    assert ResponseStore.from_env().budget == 3 << 20
    monkeypatch.setenv("YOCO_RESPONSES_STORE_MB", "lots")
    with pytest.raises(ValueError, match="YOCO_RESPONSES_STORE_MB"):
        ResponseStore.from_env()


def test_background_runs_follow_their_events_and_are_bounded(monkeypatch):
    """A follower gets the events after its sequence number, then each new one, and ends when the run ends (also
    when it was waiting at the end); one run more than YOCO_RESPONSES_BACKGROUND_MAX is a 429 naming it."""
    import asyncio
    from types import SimpleNamespace

    from impl.server.background_responses import BackgroundResponses, BackgroundRun
    from impl.server.errors import APIError
    from impl.server.streaming import sse

    monkeypatch.setenv("YOCO_RESPONSES_BACKGROUND_MAX", "1")
    runs = BackgroundResponses.from_env()

    async def scenario():
        go = asyncio.Event()

        async def events():
            for i in range(4):
                if i == 2:
                    await go.wait()  # the follower is waiting at the end of the events so far
                yield {"type": "e", "sequence_number": i, **({"response": {"id": "r1", "status": "completed"}}
                                                              if i == 3 else {})}

        req = SimpleNamespace(admitted_once=False)
        run = BackgroundRun({"id": "r1", "status": "queued"}, [], SimpleNamespace(rid="q1", req=req))
        ended = []
        runs.start(run, events(), sse, lambda r, err: ended.append(err))
        with pytest.raises(APIError, match="YOCO_RESPONSES_BACKGROUND_MAX=1") as e:
            runs.check_room()
        assert e.value.status == 429
        await asyncio.sleep(0)
        assert runs.get("r1") is run and run.now()["status"] == "queued"
        req.admitted_once = True
        assert run.now()["status"] == "in_progress"
        runs.check_integrity()
        got = []

        async def follow():
            async for ev in run.follow(0):
                got.append(json.loads(ev.decode()[len("data: "):])["sequence_number"])

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.01)
        assert got == [1] and not follower.done()
        go.set()
        await asyncio.wait_for(follower, 5)
        assert got == [1, 2, 3] and ended == [None] and runs.get("r1") is None
        assert run.now() == {"id": "r1", "status": "completed"}
        runs.check_room()  # room again

        run.events.append(sse({"sequence_number": 7}))  # a run whose events are out of order is caught
        runs._runs["r1"] = run
        with pytest.raises(AssertionError, match="sequence_number 7"):
            runs.check_integrity()

    asyncio.run(scenario())
    with pytest.raises(APIError, match="YOCO_RESPONSES_BACKGROUND_MAX=0"):
        BackgroundResponses(0).check_room()
