"""Issue 8 (HTTP server): API-shape contracts against a real server (``needs={"http"}``).

Rule ids H1-H9 (HTTP serving) are listed in the README. Every check talks HTTP only: httpx for SGLang's native
``/generate`` and the official ``openai`` client for the OpenAI routes. A server without the native routes (vLLM)
is checked through ``/v1/completions`` with token-id prompts and ``/v1/chat/completions``
(``contracts.http_dialect``); what it cannot show is noted or reported as not applicable.
"""

from __future__ import annotations

from typing import Any

import httpx

from contracts.base import contract, note, require, violation
from contracts.http_dialect import ServerAnswer, complete, complete_stream, discover, scrape, total
from contracts.http_support import (
    ARGV_OFF,
    TIMEOUT,
    gateway_of,
    model_name,
    openai_client,
    post,
    post_stream,
    prompt_ids,
)

SOURCE = "issue 8 (HTTP server)"
# OpenAI completions get a text prompt: gateways such as sglang-router accept only text there (issue 17)
PROMPT_TEXT = "The sea is calm and the sky is"


def _generate(url: str, body: dict[str, Any]) -> Any:
    r = post(url, "/generate", body)
    require(r.status_code == 200, f"POST /generate {body} answered {r.status_code}: {r.text[:300]}")
    return r.json()


def _greedy(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **extra}


# ---------------------------------------------------------------- H1


def _native_stream_equals_nonstream(url: str) -> None:
    ids = prompt_ids(1, 9)
    body = {"input_ids": ids, "sampling_params": _greedy(8)}
    full = _generate(url, body)
    cases = [body]
    text = full["text"]
    if len(text) >= 4:  # a stop string from the middle of the greedy output: both modes must trim it alike
        cases.append({"input_ids": ids, "sampling_params": _greedy(8, stop=[text[2:4]])})
    for case in cases:
        plain = _generate(url, case)
        sse = post_stream(url, "/generate", case)
        require(sse.done and sse.events, f"/generate stream must send events and end with data: [DONE]; got {sse.raw[-3:]}")
        last = sse.events[-1]
        for ev in sse.events:
            require(last["text"].startswith(ev["text"]),
                    f"/generate stream: cumulative text {ev['text']!r} is not a prefix of the final text {last['text']!r}")
        require(last["text"] == plain["text"] and last["output_ids"] == plain["output_ids"],
                f"/generate {case['sampling_params']}: stream ended with text {last['text']!r} ids {last['output_ids']}, "
                f"non-stream gave {plain['text']!r} ids {plain['output_ids']}")
        require(last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"],
                f"/generate: finish_reason differs: stream {last['meta_info']['finish_reason']} vs "
                f"{plain['meta_info']['finish_reason']}")


def _completions_stream_equals_nonstream(api) -> None:
    """The native cases through /v1/completions: a token-id prompt, then a stop string from the middle."""
    ids = prompt_ids(1, 9)
    try:
        ref = complete(api, ids, 8)
        cases: list[dict[str, Any]] = [{}]
        if len(ref.text) >= 4:
            cases.append({"stop": [ref.text[2:4]]})
        for extra in cases:
            plain, streamed = complete(api, ids, 8, **extra), complete_stream(api, ids, 8, **extra)
            require(streamed.done, f"/v1/completions stream {extra}: no data: [DONE] at the end")
            require((streamed.text, streamed.finish_reason) == (plain.text, plain.finish_reason),
                    f"/v1/completions token-id prompt {extra}: stream {streamed.text!r} ({streamed.finish_reason}) "
                    f"!= non-stream {plain.text!r} ({plain.finish_reason})")
            if api.token_ids:
                require(streamed.ids == plain.ids, f"/v1/completions {extra}: streamed token ids {streamed.ids} != "
                                                   f"non-stream {plain.ids}")
    except ServerAnswer as e:
        raise violation(str(e)) from None
    if not api.token_ids:
        note("the server returns no output token ids on /v1/completions: texts and finish reasons compared")


@contract("HTTP-STREAM-EQUALS-NONSTREAM", SOURCE, rules=("H1",), needs=("http",))
def stream_equals_nonstream(subject) -> None:
    """A greedy request streamed gives the same text, token ids and finish reason as the same request not streamed
    (SGLang /generate: every cumulative text is a prefix of the final one; OpenAI routes: the joined deltas), stop
    strings included."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    if api.native:
        _native_stream_equals_nonstream(url)
    else:
        _completions_stream_equals_nonstream(api)
    client = openai_client(url)
    model = model_name(url)
    extra = {"ignore_eos": True}
    ref = client.completions.create(model=model, prompt=PROMPT_TEXT, max_tokens=6, temperature=0, extra_body=extra)
    joined, reason = "", None
    for chunk in client.completions.create(model=model, prompt=PROMPT_TEXT, max_tokens=6, temperature=0, stream=True,
                                           extra_body=extra):
        for c in chunk.choices:
            joined += c.text
            reason = c.finish_reason or reason
    require(joined == ref.choices[0].text and reason == ref.choices[0].finish_reason,
            f"/v1/completions: joined stream {joined!r} ({reason}) != non-stream {ref.choices[0].text!r} "
            f"({ref.choices[0].finish_reason})")
    msgs = [{"role": "user", "content": "Say something."}]
    ref = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, extra_body=extra)
    joined, reason = "", None
    for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, stream=True,
                                                extra_body=extra):
        for c in chunk.choices:
            joined += c.delta.content or ""
            reason = c.finish_reason or reason
    require(joined == ref.choices[0].message.content and reason == ref.choices[0].finish_reason,
            f"/v1/chat/completions: joined stream {joined!r} ({reason}) != non-stream "
            f"{ref.choices[0].message.content!r} ({ref.choices[0].finish_reason})")


# ---------------------------------------------------------------- H2


def _finish_reasons_per_index(events: list[dict[str, Any]], route: str) -> dict[int, list[Any]]:
    seen: dict[int, list[Any]] = {}
    finished: set[int] = set()
    for ev in events:
        for c in ev.get("choices", []):
            k = c["index"]
            if k in finished:
                raise violation(f"{route}: choice {k} sent a chunk after its final finish_reason: {c}")
            seen.setdefault(k, []).append(c.get("finish_reason"))
            if c.get("finish_reason") is not None:
                finished.add(k)
    return seen


@contract("HTTP-ONE-FINISH-REASON", SOURCE, rules=("H2",), needs=("http",))
def one_finish_reason(subject) -> None:
    """Every streamed request (and every choice of an n > 1 stream) gets exactly one chunk with a non-null
    finish_reason, as its last chunk, and the stream ends with data: [DONE] and nothing after it."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    model = api.model
    if api.native:
        sse = post_stream(url, "/generate", {"input_ids": prompt_ids(2, 7), "sampling_params": _greedy(5)})
        reasons = [ev["meta_info"]["finish_reason"] for ev in sse.events]
        require(sse.done and sse.after_done == 0, "/generate stream must end with data: [DONE] and nothing after it")
        require(sum(r is not None for r in reasons) == 1 and reasons[-1] is not None,
                f"/generate stream: finish_reason per event must be null until exactly one final value, got {reasons}")
    for route, body in (
        ("/v1/completions", {"model": model, "prompt": PROMPT_TEXT, "max_tokens": 4, "n": 2, "temperature": 0.8,
                             "seed": 7, "ignore_eos": True}),
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                  "n": 2, "temperature": 0.8, "seed": 7, "ignore_eos": True,
                                  "stream_options": {"include_usage": True}}),
    ):
        sse = post_stream(url, route, body)
        require(sse.done and sse.after_done == 0, f"{route} stream must end with data: [DONE] and nothing after it")
        per = _finish_reasons_per_index(sse.events, route)
        require(sorted(per) == [0, 1], f"{route} n=2: chunks must carry choice indexes 0 and 1, got {sorted(per)}")
        for k, rs in per.items():
            finals = [r for r in rs if r is not None]
            require(len(finals) == 1, f"{route}: choice {k} got finish_reasons {rs}; exactly one must be non-null")


# ---------------------------------------------------------------- H3


@contract("HTTP-USAGE-EXACT", SOURCE, rules=("H3",), needs=("http",))
def usage_exact(subject) -> None:
    """Token accounting is exact: prompt_tokens is the prompt's token count, completion_tokens the generated tokens
    (summed over n choices, the prompt counted once), total their sum; streamed usage equals non-stream usage;
    logprobs have one entry per generated token."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    model = api.model
    ids = prompt_ids(4, 11)
    route = "/generate" if api.native else "/v1/completions"
    try:
        out = complete(api, ids, 5)
    except ServerAnswer as e:
        raise violation(str(e)) from None
    got = (out.prompt_tokens, out.completion_tokens, len(out.ids) if out.ids is not None else 5)
    require(got == (11, 5, 5), f"{route} with 11 prompt ids and max tokens 5 (EOS ignored): prompt_tokens="
                               f"{out.prompt_tokens}, completion_tokens={out.completion_tokens}, "
                               f"{'no' if out.ids is None else len(out.ids)} output ids; expected 11, 5, 5")
    client = openai_client(url)
    n = client.completions.create(model=model, prompt=PROMPT_TEXT, max_tokens=1, temperature=0,
                                  extra_body={"ignore_eos": True}).usage.prompt_tokens
    r = client.completions.create(model=model, prompt=PROMPT_TEXT, max_tokens=3, n=2, temperature=0.7, seed=3,
                                  logprobs=2, extra_body={"ignore_eos": True})
    u = r.usage
    require((u.prompt_tokens, u.completion_tokens, u.total_tokens) == (n, 6, n + 6),
            f"/v1/completions n=2, a {n}-token prompt, max_tokens=3: usage {u.prompt_tokens}/{u.completion_tokens}/"
            f"{u.total_tokens}, expected {n}/6/{n + 6} (the prompt counts once, completions per choice)")
    for c in r.choices:
        lp = c.logprobs
        require(lp is not None and len(lp.tokens) == 3 and len(lp.token_logprobs) == 3,
                f"/v1/completions logprobs=2: choice {c.index} needs 3 token entries, got {lp}")
        # the OpenAI API: "up to logprobs + 1 elements" (the sampled token is always included, besides the top 2)
        require(all(t is not None and len(t) <= 3 for t in lp.top_logprobs),
                f"/v1/completions logprobs=2: each top_logprobs entry holds at most 3 tokens (the top 2 and the "
                f"sampled one), got {lp.top_logprobs}")
    msgs = [{"role": "user", "content": "Count to three."}]
    ref = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True,
                                         top_logprobs=1, extra_body={"ignore_eos": True})
    require(ref.usage.completion_tokens == 4 and ref.usage.total_tokens == ref.usage.prompt_tokens + 4
            and ref.usage.prompt_tokens > 0, f"/v1/chat/completions max_tokens=4 (ignore_eos): usage {ref.usage}")
    require(len(ref.choices[0].logprobs.content) == 4,
            f"/v1/chat/completions logprobs: 4 entries expected, got {len(ref.choices[0].logprobs.content)}")
    streamed = None
    for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        if chunk.usage is not None:
            streamed = chunk.usage
    if streamed is None:
        raise violation("/v1/chat/completions stream with include_usage sent no usage chunk")
    require((streamed.prompt_tokens, streamed.completion_tokens, streamed.total_tokens)
            == (ref.usage.prompt_tokens, ref.usage.completion_tokens, ref.usage.total_tokens),
            f"/v1/chat/completions: streamed usage {streamed} != non-stream usage {ref.usage}")


# ---------------------------------------------------------------- H4


def _native_bad_cases(ctx: int, vocab: int) -> list[tuple[str, Any, tuple[str, ...]]]:
    """(path, body, words the error message must contain) for SGLang's /generate; a str body is sent raw."""
    g = "/generate"
    ok_sp = {"max_new_tokens": 2}
    return [
        (g, '{"text": "hi", ', ("json",)),
        (g, [1, 2], ("object",)),
        (g, {"text": 5}, ("text",)),
        (g, {"text": "hi", "input_ids": [20, 21]}, ("text", "input_ids")),
        (g, {"sampling_params": ok_sp}, ("text", "input_ids")),
        (g, {"text": ""}, ("text",)),
        (g, {"input_ids": []}, ("input_ids",)),
        (g, {"input_ids": [20] * (ctx + 8), "sampling_params": ok_sp}, ("input_ids",)),
        (g, {"input_ids": [20, vocab + 5], "sampling_params": ok_sp}, ("input_ids",)),
        (g, {"text": "hi", "sampling_params": "fast"}, ("sampling_params",)),
        (g, {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, ("max_new_tokens",)),
        (g, {"text": "hi", "sampling_params": {"max_new_tokens": True}}, ("max_new_tokens",)),
        (g, {"text": "hi", "sampling_params": {"temperature": -0.5}}, ("temperature",)),
        (g, {"text": "hi", "sampling_params": {"top_p": 0.0}}, ("top_p",)),
        (g, {"text": "hi", "sampling_params": {"top_p": 1.5}}, ("top_p",)),
        (g, {"text": "hi", "stream": "yes"}, ("stream",)),
    ]


def _openai_bad_cases(model: str) -> list[tuple[str, Any, tuple[str, ...]]]:
    c, chat = "/v1/completions", "/v1/chat/completions"
    return [
        (c, {"model": "no-such-model", "prompt": "hi"}, ("model",)),
        (c, {"model": model, "prompt": "hi", "max_tokens": "ten"}, ("max_tokens",)),
        (c, {"model": model, "prompt": ""}, ("prompt",)),
        (c, {"model": model, "prompt": "hi", "max_tokens": -3}, ("max_tokens",)),
        (c, {"model": model, "prompt": "hi", "temperature": -1}, ("temperature",)),
        (chat, {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, ("model",)),
        # "message" (the field's stem): "Provide at least one message" names the field as well as "messages" does
        (chat, {"model": model, "messages": "hello"}, ("message",)),
        (chat, {"model": model, "messages": []}, ("message",)),
        (chat, {"model": model, "messages": [{"role": "user", "content": "hi"}], "top_p": 2}, ("top_p",)),
    ]


def _completions_bad_cases(model: str, ctx: int | None, vocab: int | None) -> list[tuple[str, Any, tuple[str, ...]]]:
    """The native cases a server without /generate can still be asked, through /v1/completions."""
    c = "/v1/completions"
    ok = {"model": model, "max_tokens": 2}
    cases: list[tuple[str, Any, tuple[str, ...]]] = [
        (c, '{"model": "m", "prompt": ', ("json",)),
        (c, {**ok, "prompt": 5}, ("prompt",)),
        (c, {**ok, "prompt": []}, ("prompt",)),
        (c, {**ok, "prompt": "hi", "max_tokens": True}, ("max_tokens",)),
        (c, {**ok, "prompt": "hi", "top_p": 0.0}, ("top_p",)),
        (c, {**ok, "prompt": "hi", "top_p": 1.5}, ("top_p",)),
        (c, {**ok, "prompt": "hi", "stream": "yes"}, ("stream",)),
    ]
    if ctx:
        cases.append((c, {**ok, "prompt": [20] * (ctx + 8)}, ("context",)))
    if vocab:
        cases.append((c, {**ok, "prompt": [20, vocab + 5]}, ("token",)))
    return cases


def _error_message(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None


@contract("HTTP-BAD-INPUT-400", SOURCE, rules=("H4",), needs=("http",))
def bad_input_400(subject) -> None:
    """Malformed or invalid requests (bad JSON, wrong types, both or neither of text/input_ids, empty prompt, prompt
    over the context, max_new_tokens < 0, temperature < 0, top_p outside (0, 1], unknown model, token ids outside
    the vocabulary) get an HTTP 4xx (400; 404 for an unknown model and 422 are accepted too) with {"error":
    {"message"}} naming the field, never a 500, and the server keeps serving. On SGLang's native dialect the model
    name 'unknown' (what sglang-router puts in a chat request that has none) means no model given: it and an
    absent model are served. Behind sglang-router, a request the router itself rejects (its typed parse: a 400 or
    422 with a plain-text reason) never reaches a worker and is accepted as such."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    gateway = gateway_of(url)
    if api.native:
        cases = _native_bad_cases(int(api.context_length or 0), int(api.vocab_size or 0)) + _openai_bad_cases(api.model)
    else:
        cases = _openai_bad_cases(api.model) + _completions_bad_cases(api.model, api.context_length, api.vocab_size)
        if not (api.context_length and api.vocab_size):
            note("the server reports no context length or vocabulary: prompts over them not tried")
    problems = []  # every bad request the server did not refuse as the rule says (all of them, not the first)
    for path, body, words in cases:
        if isinstance(body, str):
            r = httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=TIMEOUT)
        else:
            r = post(url, path, body)
        shown = body if isinstance(body, str) or len(str(body)) < 120 else str(body)[:120] + "..."
        if gateway and r.status_code in (400, 422) and _error_message(r) is None:
            if r.text.strip() == "":
                problems.append(f"POST {path} {shown}: {gateway} refused it with an empty body")
            continue  # the router's own typed parse refused it; no worker saw it
        msg = _error_message(r)
        if r.status_code not in (400, 404, 422):
            problems.append(f"POST {path} {shown}: expected 400, got {r.status_code}: {r.text[:200]}")
        elif msg is None:
            problems.append(f"POST {path} {shown}: the {r.status_code} body must be {{'error': {{'message': ...}}}}, "
                            f"got {r.text[:200]}")
        elif missing := [w for w in words if w.lower() not in msg.lower()]:
            problems.append(f"POST {path} {shown}: the error must name {missing}; it said {msg[:300]!r}")
    if api.native:  # sglang-router's stand-in for a missing model: only SGLang-dialect workers stand behind it
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for extra in ({"model": "unknown"}, {}):
            r = post(url, "/v1/chat/completions", {**chat, **extra})
            require(r.status_code == 200, f"POST /v1/chat/completions with {extra or 'no model'} must be served "
                                          f"('unknown' is sglang-router's stand-in for no model); got "
                                          f"{r.status_code}: {r.text[:200]}")
    require(httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200, "/health failed after bad requests")
    try:
        out = complete(api, prompt_ids(5, 4), 2)
    except ServerAnswer as e:
        raise violation(f"a valid request after bad ones must still work: {e}") from None
    require(out.completion_tokens == 2, f"a valid request after bad ones must still work: {out}")
    require(not problems, f"{len(problems)} of {len(cases)} bad requests were not refused with a 4xx naming the "
                          "field:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- H8

REQUIRED = ("prompt_tokens", "generation_tokens", "ttft", "tpot", "e2e", "running", "waiting", "kv_usage", "cache_hit",
            "skipped_rows")


def _histogram_count(samples, name: str | None) -> float | None:
    return None if name is None else total(samples, name + "_count")


@contract("HTTP-METRICS", SOURCE, rules=("H8",), needs=("http",))
def metrics_contract(subject) -> None:
    """GET /metrics serves Prometheus text with prompt and generation token counters, TTFT / TPOT / e2e histograms,
    running and waiting requests, KV usage, cache hit rate and rows skipped by fast prefill (this project's
    counter, asked of SGLang-named metrics only), in the server's own names (sglang:*, vllm:*); one finished
    request moves the token counters by exactly its token counts and each histogram by one."""
    url = subject.base_url(ARGV_OFF)
    api = discover(url)
    names = api.metrics
    if names is None:
        raise violation(f"{url}/metrics serves no metrics in a known family's names (sglang:*, vllm:*)", project=True)
    before = scrape(url)
    metric_of = {k: getattr(names, k) for k in REQUIRED}
    hist = {"ttft", "tpot", "e2e"}
    missing = [n for k, n in metric_of.items() if n is not None
               and (_histogram_count(before, n) if k in hist else total(before, n)) is None]
    require(not missing, f"/metrics lacks {missing}")
    if names.tpot is None or names.skipped_rows is None:
        note(f"{names.family}:* has no " + " and no ".join(
            w for w, n in (("per-request TPOT histogram", names.tpot), ("fast-prefill skipped-rows counter", names.skipped_rows))
            if n is None))
    try:
        complete_stream(api, prompt_ids(6, 8), 4)
    except ServerAnswer as e:
        raise violation(str(e)) from None
    after = scrape(url)

    def moved(key: str) -> float | None:
        n = metric_of[key]
        if n is None:
            return None
        get = (lambda s: _histogram_count(s, n)) if key in hist else (lambda s: total(s, n))
        return (get(after) or 0.0) - (get(before) or 0.0)

    want = {"prompt_tokens": 8, "generation_tokens": 4, "ttft": 1, "tpot": 1, "e2e": 1}
    deltas = {metric_of[k]: moved(k) for k in want if metric_of[k] is not None}
    expected = {metric_of[k]: v for k, v in want.items() if metric_of[k] is not None}
    require(deltas == expected, f"one streamed request (8 prompt ids, 4 tokens) moved the metrics by {deltas}, "
                                f"expected {expected}")
    running, waiting = total(after, names.running), total(after, names.waiting)
    require(running == 0 and waiting == 0, f"an idle server reports {running} running / {waiting} waiting")
