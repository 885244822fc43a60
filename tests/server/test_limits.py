"""Typed, bounded requests and browser-safe defaults on a real server (issue 14, items 2-4).

Each refusal is checked for its status, its JSON error body and the words that tell the client what to fix;
after the hostile requests a normal one still completes and /health stays 200.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time

import httpx
import pytest

from contracts.http_support import TIMEOUT, post, post_stream, prompt_ids

GREEDY = {"temperature": 0.0, "ignore_eos": True}
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def _raw(url, path, content: bytes | str, headers=None) -> httpx.Response:
    h = {"content-type": "application/json"}
    h.update(headers or {})
    return httpx.post(url + path, content=content, headers=h, timeout=TIMEOUT)


def _refused(r: httpx.Response, status: int, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    msg = r.json()["error"]["message"]
    missing = [w for w in words if w.lower() not in msg.lower()]
    assert not missing, f"the error must name {missing}: {msg!r}"
    return msg


def _still_serves(url) -> None:
    assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200
    out = post(url, "/generate", {"input_ids": prompt_ids(1, 4), "sampling_params": {**GREEDY, "max_new_tokens": 2}})
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2


# ---------------------------------------------------------------- body: size, type, JSON


def test_body_size_content_type_and_malformed_json(url):
    _refused(_raw(url, "/generate", b" " * (8 * 2**20 + 1)), 413, "--max-request-body-bytes")
    _refused(_raw(url, "/generate", '{"text": "hi"}', {"content-type": "text/plain"}), 415, "application/json")
    _refused(_raw(url, "/abort_request", "rid=x", {"content-type": "application/x-www-form-urlencoded"}), 415)
    # no content type at all is read as JSON (scripts that post raw bytes keep working)
    r = httpx.post(url + "/generate", content=json.dumps({"input_ids": [20, 21], "sampling_params": {
        "max_new_tokens": 1}}).encode(), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    deep = '{"text": "hi", "x": ' + "[" * 20000 + "]" * 20000 + "}"
    _refused(_raw(url, "/generate", deep), 400, "malformed JSON", "deep")
    for body in ('{"text": "a\\ud800b"}', '{"input_ids": [20], "rid": "\\udfff"}',
                 '{"messages": [{"role": "user", "content": "\\ud83d"}]}', b'{"text": "\xff\xfe"}'):
        path = CHAT if "messages" in str(body) else "/generate"
        _refused(_raw(url, path, body), 400, "JSON")
    _refused(_raw(url, "/generate", "[1, 2]"), 400, "object")
    _still_serves(url)


# 10,000 stop strings of 2,000 characters: a 20 MB JSON body, over the 8 MiB default limit
HUGE_BODY = json.dumps({"text": "hi", "sampling_params": {"stop": ["x" * 2000] * 10_000}}).encode()


def _socket_post(url: str, body: bytes, *headers: str) -> tuple[str, dict[str, str], dict]:
    """POST ``body`` whole on a raw socket (sendall, as a client that keeps sending), then read the answer to EOF
    or its end: (status line, headers, JSON body). A server that answers and closes with body bytes unread makes
    the kernel reset the connection, and this raises ConnectionResetError."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = "\r\n".join(["POST /generate HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
                         f"Content-Length: {len(body)}", *headers, "", ""]).encode()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    raw_head, _, payload = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    return lines[0], fields, json.loads(payload)


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_oversized_body_from_a_client_that_keeps_sending_gets_its_413(url):
    """The 413 is decided from Content-Length before the body is read; the rest is read and dropped first, so a
    client that sends all 20 MB and says ``Connection: close`` (as urllib does) reads the 413, not a reset."""
    for extra in (["Connection: close"], []):
        status, _, body = _socket_post(url, HUGE_BODY, *extra)
        assert status.startswith("HTTP/1.1 413"), status
        assert "--max-request-body-bytes" in body["error"]["message"] and body["error"]["code"] == 413
    # a chunked upload without Content-Length: refused part-way through reading, the rest dropped
    chunks = (HUGE_BODY[i:i + 2**16] for i in range(0, len(HUGE_BODY), 2**16))
    r = httpx.post(url + "/generate", content=chunks, headers={"content-type": "application/json",
                                                               "connection": "close"}, timeout=TIMEOUT)
    _refused(r, 413, "--max-request-body-bytes")
    _still_serves(url)


def test_oversized_body_awaiting_100_continue_is_refused_without_it(url):
    """A client that waits for ``100 Continue`` never sent the body: it gets the 413 at once, and the answer
    closes the connection (the body it did not send cannot be told from a next request)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(HUGE_BODY)}\r\nExpect: 100-continue\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):  # the server closes after the answer
            data += chunk
    assert data.startswith(b"HTTP/1.1 413") and b"\r\nconnection: close\r\n" in data.lower(), data[:300]
    assert b"--max-request-body-bytes" in data

def test_405_keeps_allow_and_health_declares_content_type(url):
    r = httpx.get(url + "/generate", timeout=TIMEOUT)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["type"] == "MethodNotAllowedError"
    h = httpx.get(url + "/health", timeout=TIMEOUT)
    assert h.status_code == 200 and h.headers["content-type"].startswith("application/json")


# ---------------------------------------------------------------- types and ranges


@pytest.mark.parametrize("body,words", [
    ('{"text": "hi", "sampling_params": {"temperature": NaN}}', ("temperature", "finite")),
    ('{"text": "hi", "sampling_params": {"temperature": Infinity}}', ("temperature", "finite")),
    ('{"text": "hi", "sampling_params": {"top_p": -Infinity}}', ("top_p",)),
    ('{"text": "hi", "sampling_params": {"top_k": 9223372036854775808}}', ("top_k",)),
    ('{"text": "hi", "sampling_params": {"top_k": 0}}', ("top_k", "-1")),
    ('{"text": "hi", "sampling_params": {"seed": 18446744073709551616}}', ("seed",)),
    ('{"text": "hi", "sampling_params": {"skip_special_tokens": "no"}}', ("skip_special_tokens", "boolean")),
    ('{"text": "hi", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 5}}', ("min_new_tokens",)),
    ('{"text": "hi", "sampling_params": {"temprature": 1}}', ("temprature",)),
    ('{"input_ids": [20, -1]}', ("input_ids",)),
    ('{"input_ids": [20, 1e3]}', ("input_ids",)),
])
def test_type_holes_are_400(url, body, words):
    _refused(_raw(url, "/generate", body), 400, *words)


def test_limits_name_their_flag(url):
    g = "/generate"
    _refused(post(url, g, {"text": "hi", "sampling_params": {"n": 17}}), 400, "sampling_params.n", "--max-n")
    _refused(post(url, g, {"text": ["hi"] * 65}), 400, "text", "--max-batch-size")
    _refused(post(url, g, {"text": "hi", "sampling_params": {"stop": [f"s{i}" for i in range(33)]}}), 400,
             "stop", "--max-stop-strings")
    _refused(post(url, g, {"text": "hi", "sampling_params": {"stop": "x" * 257}}), 400, "stop")
    _refused(post(url, g, {"text": "hi", "sampling_params": {"stop_token_ids": [20] * 257}}), 400,
             "stop_token_ids", "--max-stop-token-ids")
    _refused(post(url, g, {"text": "hi", "return_logprob": True, "top_logprobs_num": 21}), 400,
             "top_logprobs_num", "--max-logprobs")
    _refused(post(url, "/v1/completions", {"prompt": "hi", "logprobs": 21}), 400, "logprobs", "--max-logprobs")
    _refused(post(url, CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}), 400, "top_logprobs")
    _refused(post(url, "/v1/completions", {"prompt": "hi", "n": 10**6}), 400, "n", "--max-n")
    _refused(_raw(url, g, json.dumps({"text": "hi", "sampling_params": {"stop": [str(i) for i in range(10000)]}})),
             400, "stop")
    _still_serves(url)


def test_context_overflow_is_400_naming_both_numbers(url):
    info = httpx.get(url + "/get_model_info", timeout=TIMEOUT).json()
    ctx = info["context_length"]
    ids = prompt_ids(2, ctx - 12)
    msg = _refused(post(url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 40}}), 400,
                   "max_new_tokens", str(len(ids)), "40", str(ctx), "--allow-auto-truncate")
    assert "12" in msg  # the room left
    _refused(post(url, "/v1/completions", {"prompt": ids, "max_tokens": 13}), 400, "max_tokens", str(ctx))
    _refused(post(url, "/generate", {"input_ids": prompt_ids(3, ctx + 5)}), 400, "input_ids", str(ctx))
    # refused before tokenizing 2 MB: only the character bound (intake.check_text) speaks of characters
    _refused(post(url, "/generate", {"text": "word " * 400_000}), 400, "text", "characters", str(ctx))
    # max_new_tokens not given: capped to the room left, not an error
    out = post(url, "/generate", {"input_ids": ids, "sampling_params": GREEDY}).json()
    assert out["meta_info"]["completion_tokens"] == 12 and out["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("extra,field", [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"best_of": 3}, "best_of"),
])
def test_unimplemented_openai_fields_are_400(url, extra, field):
    _refused(post(url, CHAT, {"messages": MSG, "max_tokens": 1, **extra}), 400, field, "not supported")


@pytest.mark.parametrize("extra,field", [
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": list(range(5000))}}}}, "response_format"),
    ({"logit_bias": {"20": 500}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {str(10**9): 1}}, "logit_bias"),
])
def test_bad_structured_output_fields_are_400(url, extra, field):
    _refused(post(url, CHAT, {"messages": MSG, "max_tokens": 1, **extra}), 400, field)


def test_unused_values_of_optional_fields_are_accepted(url):
    r = post(url, CHAT, {"messages": MSG, "max_tokens": 1, "tool_choice": "none", "tools": [],
                         "response_format": {"type": "text"}, "logit_bias": {}, "user": "u"})
    assert r.status_code == 200, r.text
    _refused(post(url, "/v1/completions", {"prompt": "hi", "suffix": "end"}), 400, "suffix")
    _refused(post(url, "/v1/completions", {"prompt": "hi", "echo": "yes"}), 400, "echo")


def test_duplicate_live_rid_is_400(url):
    rid = "dup-rid-14"
    body = {"input_ids": prompt_ids(4, 6), "rid": rid, "sampling_params": {**GREEDY, "max_new_tokens": 200}}
    first: dict = {}

    def run():
        first["sse"] = post_stream(url, "/generate", body)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 30
    while httpx.get(url + "/get_server_info", timeout=TIMEOUT).json()["num_running_reqs"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _refused(post(url, "/generate", {**body, "sampling_params": {"max_new_tokens": 1}}), 400, rid, "in use")
    _refused(post(url, "/generate", {"input_ids": [prompt_ids(5, 3)] * 2, "rid": ["r2", "r2"]}), 400, "r2")
    th.join()
    assert first["sse"].done and first["sse"].events[-1]["meta_info"]["completion_tokens"] == 200
    assert post(url, "/generate", {**body, "sampling_params": {"max_new_tokens": 1}}).status_code == 200  # free again


def test_stream_logprobs_are_incremental(url):
    body = {"input_ids": prompt_ids(6, 5), "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
            "sampling_params": {**GREEDY, "max_new_tokens": 6}}
    full = post(url, "/generate", body).json()["meta_info"]
    sse = post_stream(url, "/generate", body)
    got = [e for ev in sse.events for e in ev["meta_info"]["output_token_logprobs"]]
    tops = [e for ev in sse.events for e in ev["meta_info"]["output_top_logprobs"]]
    assert [t for _, t, _ in got] == [t for _, t, _ in full["output_token_logprobs"]]
    assert len(tops) == 6 and all(len(t) == 3 for t in tops)
    assert sum(len(ev["meta_info"]["input_token_logprobs"]) for ev in sse.events) == 5  # the prompt's, once


# ---------------------------------------------------------------- browser-safe defaults


def test_foreign_host_and_origin_are_403(url):
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io"):
        _refused(httpx.get(url + "/get_server_info", headers={"host": host}, timeout=TIMEOUT), 403, "host",
                 "--allowed-hosts")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3"):
        assert httpx.get(url + "/health", headers={"host": host}, timeout=TIMEOUT).status_code == 200
    body = {"rid": "someone-elses", "abort_all": True}
    for origin in ("http://evil.example", "null", "http://localhost:3000"):
        _refused(post(url, "/abort_request", body, headers={"origin": origin}), 403, "origin", "--allowed-origins")
        _refused(_raw(url, "/generate", '{"text": "hi"}', {"origin": origin, "content-type": "text/plain"}), 403)
    same = post(url, "/generate", {"input_ids": [20, 21], "sampling_params": {"max_new_tokens": 1}},
                headers={"origin": url})
    assert same.status_code == 200


def test_allowed_origins_hosts_and_flags(hardened_url):
    open_url = hardened_url
    r = httpx.options(open_url + "/generate", headers={"origin": "http://app.example",
                                                       "access-control-request-method": "POST"}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
    ok = post(open_url, "/generate", {"input_ids": [20, 21], "sampling_params": {"max_new_tokens": 1}},
              headers={"origin": "http://app.example", "host": "llm.internal"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
    _refused(post(open_url, "/generate", {"text": "hi"}, headers={"origin": "http://evil.example"}), 403)
    _refused(post(open_url, "/generate", {"text": "hi", "sampling_params": {"n": 3}}), 400, "--max-n")
    ctx = httpx.get(open_url + "/get_model_info", timeout=TIMEOUT).json()["context_length"]
    out = post(open_url, "/generate", {"input_ids": prompt_ids(7, ctx + 40), "sampling_params": {
        **GREEDY, "max_new_tokens": 30}}).json()  # --allow-auto-truncate: prompt cut, max_new_tokens capped
    assert out["meta_info"]["prompt_tokens"] == ctx - 1 and out["meta_info"]["completion_tokens"] == 1
    # echo of a cut prompt: what was kept (its tokens and logprobs), not what was sent
    text = " ".join(["sea"] * (2 * ctx))
    cut = post(open_url, "/v1/completions", {"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 1, **GREEDY})
    assert cut.status_code == 200, cut.text
    ch = cut.json()["choices"][0]
    assert len(ch["logprobs"]["tokens"]) == ctx and text.startswith(ch["text"][len("<bos>"):][:20])
    assert len(ch["text"]) < len(text)


def test_max_logprobs_flag_bounds_every_route(hardened_url):
    """--max-logprobs 64 (the hardened server): 64 top logprobs are served on all three generation routes, 65 is a
    400 naming the field and the flag (completions and chat once had a hard-coded bound of 20)."""
    url, ids = hardened_url, prompt_ids(8, 4)
    sp = {**GREEDY, "max_new_tokens": 2}
    gen = post(url, "/generate", {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 64, "sampling_params": sp})
    assert gen.status_code == 200, gen.text
    assert [len(t) for t in gen.json()["meta_info"]["output_top_logprobs"]] == [64, 64]
    cmp = post(url, "/v1/completions", {"prompt": ids, "logprobs": 64, "max_tokens": 2, **GREEDY})
    assert cmp.status_code == 200, cmp.text
    assert len(cmp.json()["choices"][0]["logprobs"]["top_logprobs"]) == 2  # keyed by token text: up to 64 each
    chat = post(url, CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 64, "max_tokens": 2, **GREEDY})
    assert chat.status_code == 200, chat.text
    assert [len(c["top_logprobs"]) for c in chat.json()["choices"][0]["logprobs"]["content"]] == [64, 64]
    _refused(post(url, "/generate", {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 65}), 400,
             "top_logprobs_num", "--max-logprobs")
    _refused(post(url, "/v1/completions", {"prompt": ids, "logprobs": 65}), 400, "logprobs", "--max-logprobs")
    _refused(post(url, CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 65}), 400, "top_logprobs",
             "--max-logprobs")


@pytest.mark.slow  # starts its own server process
def test_bad_limit_flag_is_refused_at_startup():
    from impl.args.server_args import ServerArgs
    from impl.server.limits import RequestLimits

    with pytest.raises(ValueError, match="--max-n"):
        RequestLimits.from_args(ServerArgs(max_n=0))


# ---------------------------------------------------------------- the event loop stays free


def test_health_is_fast_while_large_requests_are_handled(url):
    """Maximal bodies (8 MB of prompt text, 10,000 stop strings) are parsed, checked and refused off the event
    loop: /health keeps answering meanwhile, in a small fraction of the time one large request takes (a ratio of
    two latencies measured side by side, so a slow shared machine slows both). Were the parsing on the loop, a
    health check would wait for the parse in progress: about half a large request's time, or more."""
    big_text = json.dumps({"text": "sea " * (2 * 2**20 - 16)})
    many_stops = json.dumps({"text": "hi", "sampling_params": {"stop": ["s" * 200] * 10000}})
    assert len(big_text) < 8 * 2**20
    stop = threading.Event()
    codes: list[int] = []
    large: list[float] = []

    def hammer(body: str) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            codes.append(_raw(url, "/generate", body).status_code)
            large.append(time.perf_counter() - t)

    workers = [threading.Thread(target=hammer, args=(b,)) for b in (big_text, big_text, many_stops)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    lat = []
    with httpx.Client(timeout=TIMEOUT) as c:
        for _ in range(30):
            t = time.perf_counter()
            assert c.get(url + "/health").status_code == 200
            lat.append(time.perf_counter() - t)
            time.sleep(0.05)
    stop.set()
    for w in workers:
        w.join()
    assert codes and set(codes) == {400}
    health, handled = statistics.median(lat), statistics.median(large)
    assert health < 0.2 * handled, f"/health median {health * 1000:.0f} ms vs a large request's {handled * 1000:.0f} ms: {lat}"
