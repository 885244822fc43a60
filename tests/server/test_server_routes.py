"""Every route of a real server (tiny e2b on a free loopback port), with httpx and the openai client."""

from __future__ import annotations

import json

import httpx
import pytest

from contracts.http_support import ARGV_ON, openai_client, post, post_stream, prompt_ids
from tests.helpers.busy_server import while_generating

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _gen(url, **body):
    r = post(url, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_and_health_generate(url):
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/health_generate", timeout=60).status_code == 200


def test_model_retrieval_and_ping(url):
    """OpenAI's GET /v1/models/{id} (the client's models.retrieve) under the names a request may use, a 404 for
    others; vLLM's /ping answers as /health."""
    served = httpx.get(url + "/v1/models").json()["data"][0]
    assert openai_client(url).models.retrieve(served["id"]).id == served["id"]
    assert httpx.get(url + "/v1/models/default").json() == served
    missing = httpx.get(url + "/v1/models/no-such-model")
    assert missing.status_code == 404 and "no-such-model" in missing.json()["error"]["message"]
    assert httpx.get(url + "/ping").status_code == httpx.post(url + "/ping").status_code == 200


def test_model_and_server_info(url):
    a, b = httpx.get(url + "/get_model_info").json(), httpx.get(url + "/model_info").json()
    assert a == b and a["is_generation"] is True and a["context_length"] == 512 and a["num_kv_shared_layers"] == 20
    info = httpx.get(url + "/get_server_info").json()
    assert info["kv_sharing_fast_prefill"] is False
    # Gemma-4: an unset --attention-backend resolves to triton; the decode side stays as given
    assert info["attention_backend"] == "triton" and info["decode_attention_backend"] == "torch_native"
    assert any("handle_attention_backend_default" in r for r in info["resolutions"])
    assert httpx.get(url + "/server_info").json()["max_total_num_tokens"] == 4096
    models = httpx.get(url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == a["served_model_name"]


def test_generate_text_and_input_ids_agree(url):
    out = _gen(url, text="The sea is", sampling_params={**GREEDY, "max_new_tokens": 4})
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4} and meta["e2e_latency"] > 0
    assert set(meta) >= {"id", "prompt_tokens", "cached_tokens", "ttft"}
    ids = _gen(url, input_ids=prompt_ids(1, 6), sampling_params={**GREEDY, "max_new_tokens": 3})
    assert ids["meta_info"]["prompt_tokens"] == 6


def test_generate_batch_and_n(url):
    outs = _gen(url, input_ids=[prompt_ids(2, 4), prompt_ids(3, 7)], sampling_params={**GREEDY, "max_new_tokens": 2})
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [4, 7]
    alone = _gen(url, input_ids=prompt_ids(3, 7), sampling_params={**GREEDY, "max_new_tokens": 2})
    assert outs[1]["output_ids"] == alone["output_ids"]
    sampled = _gen(url, input_ids=prompt_ids(4, 5), sampling_params={"max_new_tokens": 6, "n": 3, "seed": 11,
                                                                     "temperature": 1.0, "ignore_eos": True})
    assert len(sampled) == 3 and len({tuple(o["output_ids"]) for o in sampled}) > 1
    again = _gen(url, input_ids=prompt_ids(4, 5), sampling_params={"max_new_tokens": 6, "n": 3, "seed": 11,
                                                                   "temperature": 1.0, "ignore_eos": True})
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in sampled]  # seeded: reproducible


def test_generate_logprobs(url):
    out = _gen(url, input_ids=prompt_ids(5, 6), sampling_params={**GREEDY, "max_new_tokens": 3}, return_logprob=True,
               logprob_start_len=0, top_logprobs_num=2)
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert len(meta["input_token_logprobs"]) == 6 and meta["input_token_logprobs"][0][0] is None
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    # greedy: the chosen token is the top-1 entry
    assert [top[0][1] for top in meta["output_top_logprobs"]] == out["output_ids"]


def test_generate_return_text_in_logprobs(url):
    """SGLang's return_text_in_logprobs: every entry's third slot is its token's text (what /detokenize gives for that
    one id, special tokens kept), the prompt's and the output's, top entries too, streamed or not; None without it."""
    body = {"input_ids": [2, *prompt_ids(25, 5)], "sampling_params": {**GREEDY, "max_new_tokens": 3},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
    plain = post(url, "/generate", body).json()["meta_info"]
    assert all(e[2] is None for e in plain["input_token_logprobs"] + plain["output_token_logprobs"])
    meta = post(url, "/generate", {**body, "return_text_in_logprobs": True}).json()["meta_info"]
    entries = meta["input_token_logprobs"] + meta["output_token_logprobs"] + [
        e for top in meta["input_top_logprobs"] + meta["output_top_logprobs"] if top for e in top]
    texts = {i: post(url, "/detokenize", {"tokens": [i]}).json()["prompt"] for i in {e[1] for e in entries}}
    assert all(e[2] == texts[e[1]] for e in entries) and meta["input_token_logprobs"][0][2] == "<bos>"
    assert [e[:2] for e in meta["output_token_logprobs"]] == [e[:2] for e in plain["output_token_logprobs"]]
    sse = post_stream(url, "/generate", {**body, "return_text_in_logprobs": True})
    streamed = [e for ev in sse.events for e in ev["meta_info"]["output_token_logprobs"]]
    assert streamed == meta["output_token_logprobs"]


def test_stream_framing_is_sse(url):
    with httpx.stream("POST", url + "/generate", json={"input_ids": prompt_ids(6, 4), "stream": True,
                                                       "sampling_params": {**GREEDY, "max_new_tokens": 2}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2]) and len(events) - 2 == 2


def test_openai_client_completions_and_chat(url):
    client = openai_client(url)
    model = client.models.list().data[0].id
    c = client.completions.create(model=model, prompt="Once upon", max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 3
    batch = client.completions.create(model=model, prompt=["a b", "c d"], max_tokens=2, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert [ch.index for ch in batch.choices] == [0, 1] and batch.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": "Hi"}],
                                          max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 3


def test_completions_return_token_ids(url):
    """vLLM's return_token_ids: each choice carries its output ids (per chunk when streamed), the ids
    /generate gives, also for tokens with no text of their own."""
    ids = prompt_ids(12, 6)
    want = post(url, "/generate", {"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 8}}).json()["output_ids"]
    body = {"prompt": ids, "max_tokens": 8, **GREEDY, "return_token_ids": True}
    assert post(url, "/v1/completions", body).json()["choices"][0]["token_ids"] == want
    sse = post_stream(url, "/v1/completions", body)
    assert [t for ev in sse.events for ch in ev["choices"] for t in ch["token_ids"]] == want
    assert "token_ids" not in post(url, "/v1/completions", {**body, "return_token_ids": False}).json()["choices"][0]


def _echo_scored(url, ids, **extra):
    """lm-evaluation-harness's loglikelihood request (local-completions): token ids, echo, logprobs 1, greedy."""
    body = {"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234, **extra}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_completions_echo_scores_the_prompt_as_lm_eval_reads_it(url):
    """echo + logprobs: the prompt's tokens first (the first logprob null), each the logprob /generate gives for
    that prompt token, then the output token's; the text is the prompt's decoding and then the output's."""
    ids = [2, *prompt_ids(21, 9)]
    ref = _gen(url, input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 1}, return_logprob=True,
               logprob_start_len=0, top_logprobs_num=1)
    meta = ref["meta_info"]
    want = [lp for lp, _, _ in meta["input_token_logprobs"]] + [lp for lp, _, _ in meta["output_token_logprobs"]]
    for _ in range(2):  # the second time the prompt is in the radix cache: its logprobs are still all there
        ch = _echo_scored(url, ids)
        lp = ch["logprobs"]
        assert lp["token_logprobs"] == want and lp["token_logprobs"][0] is None
        assert lp["top_logprobs"][0] is None and all(len(t) == 1 for t in lp["top_logprobs"][1:])
        assert len(lp["tokens"]) == len(lp["text_offset"]) == len(ids) + 1
        echoed = ch["text"][: len(ch["text"]) - len(ref["text"])]
        assert ch["text"] == echoed + ref["text"] and echoed.startswith("<bos>")
        assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == len(echoed)
        assert lp["text_offset"] == sorted(lp["text_offset"])
    # lm-eval's parse: the continuation's logprob sums the entries [ctxlen:-1]; greedy iff each is its top entry
    ctxlen = 4
    cont = lp["token_logprobs"][ctxlen:-1]
    assert cont == want[ctxlen:-1] and sum(cont) < 0
    greedy = all(t == max(top.values()) for t, top in zip(cont, lp["top_logprobs"][ctxlen:-1]))
    assert greedy == all(i == top[0][1] for i, top in zip(ids[ctxlen:], meta["input_top_logprobs"][ctxlen:]))


def test_completions_echo_with_fast_prefill_scores_as_without(url):
    """The flag-on server's echo logprobs are the flag-off server's, bit for bit: every prompt row reaches the LM
    head (the cross-decoder runs on them), so a loglikelihood evaluation reads the same numbers."""
    from contracts.adapters.impl_http import base_url

    on = base_url(ARGV_ON)
    for ids in ([2, *prompt_ids(23, 40)], prompt_ids(24, 17)):
        assert _echo_scored(on, ids) == _echo_scored(url, ids)


def test_completions_echo_without_generation_text_prompts_and_streams(url):
    ids = prompt_ids(22, 7)
    zero = _echo_scored(url, ids, max_tokens=0)
    assert zero["finish_reason"] == "length" and len(zero["logprobs"]["token_logprobs"]) == len(ids)
    assert zero["logprobs"]["token_logprobs"] == _echo_scored(url, ids)["logprobs"]["token_logprobs"][:-1]
    # a text prompt is echoed as sent, before every choice of it; without logprobs none are computed
    body = {"prompt": ["The sea is", "A cat"], "max_tokens": 3, "n": 2, "echo": True, **GREEDY}
    r = post(url, "/v1/completions", body).json()
    plain = post(url, "/v1/completions", {**body, "echo": False}).json()
    assert [c["text"] for c in r["choices"]] == [p + c["text"] for p, c in
                                                 zip(["The sea is"] * 2 + ["A cat"] * 2, plain["choices"])]
    counts = ("prompt_tokens", "completion_tokens")  # (cached_tokens follows the radix cache: the second call hits it)
    assert [r["usage"][k] for k in counts] == [plain["usage"][k] for k in counts]
    assert all(c["logprobs"] is None for c in r["choices"])
    # streamed: the first chunk of each choice starts with the prompt, the logprobs as the answer's
    one = {"prompt": ids, "max_tokens": 4, "logprobs": 2, "echo": True, **GREEDY}
    whole = post(url, "/v1/completions", one).json()["choices"][0]
    sse = post_stream(url, "/v1/completions", one)
    chunks = [ch for ev in sse.events for ch in ev["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"] and chunks[0]["text"].startswith(whole["text"][:5])
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for c in chunks for x in c["logprobs"][key]] == whole["logprobs"][key]


def test_prompt_logprobs_as_vllm_returns_them(url):
    """vLLM's prompt_logprobs: per prompt token (the first null) a dict keyed by token id, the prompt token first with
    its rank in the vocabulary, then its position's top k (ranks 1..k); the numbers /generate's prompt logprobs give;
    the output's logprobs keep their own k; chat puts them beside the choices; the flag-on server's are the same."""
    from contracts.adapters.impl_http import base_url

    base = [2, *prompt_ids(25, 10)]
    ids = base + _gen(url, input_ids=base, sampling_params={**GREEDY, "max_new_tokens": 4})["output_ids"]
    ref = _gen(url, input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 1}, return_logprob=True,
               logprob_start_len=0, top_logprobs_num=20)["meta_info"]
    body = {"prompt": ids, "max_tokens": 2, "logprobs": 1, "prompt_logprobs": 3, **GREEDY}
    ch = post(url, "/v1/completions", body).json()["choices"][0]
    plp = ch["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    assert all(len(t) == 1 for t in ch["logprobs"]["top_logprobs"])  # logprobs 1, though the engine gave 3
    for i in range(1, len(ids)):
        entry, (lp, tok, _), top20 = plp[i], ref["input_token_logprobs"][i], ref["input_top_logprobs"][i]
        keys = list(entry)
        assert keys[0] == str(tok) == str(ids[i]) and entry[keys[0]]["logprob"] == lp
        assert keys[1:] == [str(t) for _, t, _ in top20[:3] if t != tok] or keys == [str(t) for _, t, _ in top20[:3]]
        assert [entry[str(t)]["logprob"] for _, t, _ in top20[:3]] == [l for l, _, _ in top20[:3]]
        assert [entry[str(t)]["rank"] for _, t, _ in top20[:3]] == [1, 2, 3]
        assert entry[str(tok)]["decoded_token"] == httpx.post(url + "/detokenize", json={"tokens": [tok]}).json()["prompt"]
        # its rank: its place among the 20 most likely, or below them
        top_ids = [t for _, t, _ in top20]
        assert entry[str(tok)]["rank"] == top_ids.index(tok) + 1 if tok in top_ids else entry[str(tok)]["rank"] > 20
    assert [plp[i][str(ids[i])]["rank"] for i in range(len(base), len(ids))] == [1] * 4  # the greedy continuation
    assert max(plp[i][str(ids[i])]["rank"] for i in range(1, len(base))) > 20  # random tokens: far down
    zero = post(url, "/v1/completions", {**body, "prompt_logprobs": 0, "logprobs": None}).json()["choices"][0]
    assert zero["logprobs"] is None and [list(e) if e else e for e in zero["prompt_logprobs"]] == \
        [None, *[[str(t)] for t in ids[1:]]]
    assert [e and {k: v["rank"] for k, v in e.items()} for e in zero["prompt_logprobs"]] == \
        [e and {k: v["rank"] for k, v in e.items() if k == k0} for e, k0 in zip(plp, [None, *map(str, ids[1:])])]
    on = base_url(ARGV_ON)
    assert post(on, "/v1/completions", body).json()["choices"][0]["prompt_logprobs"] == plp
    msgs = {"messages": [{"role": "user", "content": "The sea is"}], "max_tokens": 2, **GREEDY}
    chat = post(url, "/v1/chat/completions", {**msgs, "prompt_logprobs": 2, "n": 2}).json()
    assert chat["prompt_logprobs"][0] is None and all(1 <= len(e) <= 3 for e in chat["prompt_logprobs"][1:])
    assert all(c["logprobs"] is None for c in chat["choices"])
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    for route, b in (("/v1/completions", body), ("/v1/chat/completions", msgs)):
        for bad, says in (({"prompt_logprobs": 1, "stream": True}, "streaming"), ({"prompt_logprobs": -1}, "--max-logprobs"),
                          ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": "3"}, "prompt_logprobs")):
            r = post(url, route, {**b, **bad})
            assert r.status_code == 400 and says in r.json()["error"]["message"], (route, bad, r.text)


def test_tokenize_detokenize_and_tokenizer_info(url):
    """vLLM's /tokenize, /detokenize and /tokenizer_info: the ids the generation routes use, what
    lm-evaluation-harness's remote tokenizer checks for (eos_token; tokens of a text without special tokens)."""
    text = "The sea is calm tonight"
    tok = post(url, "/tokenize", {"prompt": text}).json()
    gen = _gen(url, text=text, sampling_params={**GREEDY, "max_new_tokens": 1})
    assert tok["count"] == len(tok["tokens"]) == gen["meta_info"]["prompt_tokens"] and tok["token_strs"] is None
    assert tok["max_model_len"] == 512 and tok["tokens"][0] == 2  # Gemma's bos
    bare = post(url, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True}).json()
    assert bare["tokens"] == tok["tokens"][1:] and len(bare["token_strs"]) == bare["count"]
    assert post(url, "/detokenize", {"tokens": bare["tokens"]}).json() == {"prompt": text}
    assert post(url, "/detokenize", {"tokens": tok["tokens"]}).json()["prompt"] == "<bos>" + text
    msgs = [{"role": "user", "content": "Hi"}]
    chat = post(url, "/tokenize", {"messages": msgs}).json()
    done = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, **GREEDY}).json()
    assert chat["count"] == done["usage"]["prompt_tokens"]
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] and info["bos_token"] == "<bos>" and info["model_max_length"] == 512
    for body, field in (({"prompt": "a", "messages": msgs}, "prompt"), ({}, "prompt"), ({"tokens": [10**6]}, "tokens"),
                        ({"tokens": ["5"]}, "tokens"), ({"prompt": 5}, "prompt")):
        path = "/detokenize" if "tokens" in body else "/tokenize"
        r = post(url, path, body)
        assert r.status_code == 400 and field in r.json()["error"]["message"], (body, r.text)


def test_sglang_and_vllm_output_constraints_on_the_openai_routes(url):
    """SGLang's regex / ebnf and vLLM's structured_outputs (and its guided_* spellings) constrain the output as
    response_format does; two constraints are a 400 naming the second; vLLM fields not implemented are 400s."""
    base = {"prompt": "Answer:", "max_tokens": 8, "temperature": 1.0, "seed": 3}
    chat = {"messages": [{"role": "user", "content": "Answer"}], "max_tokens": 8, "temperature": 1.0, "seed": 3}
    yes_no = {"yes", "no"}
    for extra in ({"regex": "(yes|no)"}, {"ebnf": 'root ::= "yes" | "no"'}, {"guided_regex": "(yes|no)"},
                  {"guided_choice": ["yes", "no"]}, {"guided_grammar": 'root ::= "yes" | "no"'},
                  {"structured_outputs": {"choice": ["yes", "no"]}}, {"structured_outputs": {"regex": "(yes|no)"}}):
        r = post(url, "/v1/completions", {**base, **extra})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] in yes_no, (extra, r.text)
        r = post(url, "/v1/chat/completions", {**chat, **extra})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in yes_no, (extra, r.text)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": json.dumps(schema)}}):
        r = post(url, "/v1/completions", {**base, "max_tokens": 40, **extra})
        out = r.json()["choices"][0]
        if out["finish_reason"] == "stop":
            assert set(json.loads(out["text"])) == {"a"}
        assert out["text"].startswith('{"a":') or out["text"].startswith('{ "a"') or out["text"].startswith('{\n'), out
    # a choice's regex metacharacters are literal
    r = post(url, "/v1/completions", {**base, "guided_choice": ["a.b", "(c)"]})
    assert r.json()["choices"][0]["text"] in {"a.b", "(c)"}
    for body, field in (({**base, "regex": "a", "ebnf": 'root ::= "a"'}, "ebnf"),
                        ({**base, "response_format": {"type": "json_object"}, "guided_choice": ["x"]}, "guided_choice"),
                        ({**base, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
                        ({**base, "regex": "(unclosed"}, "regex"), ({**base, "use_beam_search": True}, "use_beam_search"),
                        ({**base, "best_of": 2}, "best_of")):
        r = post(url, "/v1/completions", body)
        assert r.status_code == 400 and field in r.json()["error"]["message"], (body, r.text)


def test_generate_prompt_token_ids_and_sglang_fields_not_served(url):
    """SGLang's return_prompt_token_ids: every output dict carries its prompt's ids (streamed: every event); its
    request fields this server does not serve are 400s naming them, their defaults pass."""
    body = {"text": ["The sea is", "A cat"], "sampling_params": {**GREEDY, "max_new_tokens": 2},
            "return_prompt_token_ids": True}
    outs = _gen(url, **body)
    want = [post(url, "/tokenize", {"prompt": t}).json()["tokens"] for t in body["text"]]
    assert [o["prompt_token_ids"] for o in outs] == want
    sse = post_stream(url, "/generate", {**body, "stream": True})
    assert all(ev["prompt_token_ids"] == want[ev["index"]] for ev in sse.events)
    assert "prompt_token_ids" not in _gen(url, text="Hi", sampling_params={"max_new_tokens": 1})
    for field, value in (("priority", 2), ("extra_key", "t"), ("return_entropy", True), ("bootstrap_room", 7),
                         ("max_thinking_tokens", 5), ("data_parallel_rank", -1), ("modalities", ["image"])):
        r = post(url, "/generate", {"text": "Hi", field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
    ok = post(url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, "priority": None,
                                 "log_metrics": True, "return_entropy": False, "session_id": "s", "custom_labels": {},
                                 "data_parallel_rank": 0})
    assert ok.status_code == 200, ok.text


def test_cache_salt_shares_prefixes_only_within_a_salt(url):
    """vLLM's and SGLang's cache_salt: a prompt cached under one salt is a hit for that salt only (usage's and
    meta_info's cached tokens), on both routes; the answer is the same."""
    ids = prompt_ids(33, 24)
    sp = {**GREEDY, "max_new_tokens": 2}

    def cached(**extra):
        return _gen(url, input_ids=ids, sampling_params=sp, **extra)["meta_info"]["cached_tokens"]

    assert cached(cache_salt="s1-" + "k" * 40) == 0
    assert cached(cache_salt="s2-" + "k" * 40) == 0 and cached() == 0
    assert cached(cache_salt="s1-" + "k" * 40) == len(ids) - 1
    body = {"prompt": prompt_ids(34, 20), "max_tokens": 2, **GREEDY}
    first = post(url, "/v1/completions", {**body, "cache_salt": "t"}).json()
    other = post(url, "/v1/completions", {**body, "cache_salt": "u"}).json()
    again = post(url, "/v1/completions", {**body, "cache_salt": "t"}).json()
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, other, again)] == [0, 0, 19]
    assert first["choices"][0]["text"] == other["choices"][0]["text"] == again["choices"][0]["text"]
    two = _gen(url, input_ids=[ids, ids], sampling_params=sp, cache_salt=["s1-" + "k" * 40, "z"])
    assert [o["meta_info"]["cached_tokens"] for o in two] == [len(ids) - 1, 0]
    for bad in ("", ["a"], 5):
        r = post(url, "/generate", {"input_ids": [ids, ids], "cache_salt": bad})
        assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"], (bad, r.text)


def test_generate_refuses_sglang_fields_it_does_not_serve(url):
    """An image, a LoRA adapter or hidden states asked of /generate are 400s naming the field (not ignored, which
    answered as if the image were not there); their unused values (SGLang's bench client sends lora_path null)
    pass."""
    body = {"text": "Describe it", "sampling_params": {**GREEDY, "max_new_tokens": 1}}
    for field, value in (("image_data", "http://example.com/cat.png"), ("audio_data", ["a.wav"]), ("lora_path", "ad"),
                         ("return_hidden_states", True), ("token_ids_logprob", [5]), ("input_embeds", [[0.1]])):
        r = post(url, "/generate", {**body, field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
    ok = post(url, "/generate", {**body, "lora_path": None, "image_data": [], "return_hidden_states": False})
    assert ok.status_code == 200, ok.text


def test_chat_developer_role_is_a_system_message(url):
    """OpenAI's developer role renders as the system message Gemma's template knows (it was a template error)."""
    msgs = [{"role": "developer", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    as_system = [{"role": "system", "content": "Be brief"}, msgs[1]]
    ids = post(url, "/tokenize", {"messages": msgs}).json()["tokens"]
    assert ids == post(url, "/tokenize", {"messages": as_system}).json()["tokens"]
    r = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, **GREEDY})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(ids), r.text


def test_chat_continue_final_message(url):
    msgs = [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": "The sea is"}]
    body = {"messages": msgs, "add_generation_prompt": False, "continue_final_message": True}
    tok = post(url, "/tokenize", body).json()
    assert post(url, "/detokenize", {"tokens": tok["tokens"]}).json()["prompt"].endswith("<start_of_turn>model\nThe sea is")
    r = post(url, "/v1/chat/completions", {**body, "max_tokens": 2, **GREEDY})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == tok["count"]
    bad = post(url, "/v1/chat/completions", {"messages": msgs, "continue_final_message": True, "max_tokens": 2})
    assert bad.status_code == 400 and "add_generation_prompt" in bad.json()["error"]["message"]
    # vLLM's chat echo: the final assistant message's text starts the answer (streamed: in the first chunk)
    answer = r.json()["choices"][0]["message"]["content"]
    echoed = post(url, "/v1/chat/completions", {**body, "max_tokens": 2, "echo": True, "n": 2, **GREEDY}).json()
    assert [c["message"]["content"] for c in echoed["choices"]] == ["The sea is" + answer] * 2
    assert echoed["usage"]["prompt_tokens"] == tok["count"] and echoed["usage"]["completion_tokens"] == 4
    sse = post_stream(url, "/v1/chat/completions", {**body, "max_tokens": 2, "echo": True, "stream": True, **GREEDY})
    deltas = [ch["delta"] for ev in sse.events for ch in ev["choices"]]
    assert deltas[0] == {"role": "assistant", "content": "The sea is"} or deltas[0]["content"].startswith("The sea is")
    assert "".join(d.get("content") or "" for d in deltas) == "The sea is" + answer
    parts = [{"role": "user", "content": "Tell me"},
             {"role": "assistant", "content": [{"type": "text", "text": "The"}, {"type": "text", "text": "sea"}]}]
    two = post(url, "/v1/chat/completions", {"messages": parts, "add_generation_prompt": False,
                                             "continue_final_message": True, "echo": True, "max_tokens": 1, **GREEDY})
    assert two.json()["choices"][0]["message"]["content"].startswith("The\nsea")
    # after a user message nothing is echoed
    user = {"messages": msgs[:1], "max_tokens": 2, **GREEDY}
    assert post(url, "/v1/chat/completions", {**user, "echo": True}).json()["choices"] == \
        post(url, "/v1/chat/completions", user).json()["choices"]


def test_allowed_token_ids_and_bad_words(url):
    """vLLM's allowed_token_ids: every sampled token is one of them (greedy and sampled, both routes); bad_words: the
    word's tokens never end the output (as written or after a space); a grammar that leaves no allowed token fails
    that request alone with a message naming allowed_token_ids."""
    base = {"prompt": prompt_ids(28, 6), "max_tokens": 8, **GREEDY}
    free = post(url, "/v1/completions", {**base, "return_token_ids": True}).json()["choices"][0]["token_ids"]
    allowed = [free[3], 17, 42]
    for extra in ({}, {"temperature": 1.0, "seed": 3, "n": 3}):
        r = post(url, "/v1/completions", {**base, **extra, "allowed_token_ids": allowed, "return_token_ids": True})
        assert all(set(c["token_ids"]) <= set(allowed) and len(c["token_ids"]) == 8 for c in r.json()["choices"])
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                              "allowed_token_ids": [100], "logprobs": True, **GREEDY}).json()
    assert chat["choices"][0]["logprobs"]["content"][0]["logprob"] == 0.0  # one token left: probability 1
    # bad words: a one-token word is never sampled; a two-token word's second token only not right after its first
    def tok(text):
        return httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]

    def text(ids):
        return httpx.post(url + "/detokenize", json={"tokens": ids}).json()["prompt"]

    long = {**base, "max_tokens": 32}
    free = post(url, "/v1/completions", {**long, "return_token_ids": True}).json()["choices"][0]["token_ids"]
    for k in (1, 2):  # the answer's first k-token span seen there first whose text (no leading space) tokenizes back
        i = next(i for i in range(len(free) - k + 1) if text(free[i:i + k])[:1].strip()
                 and tok(text(free[i:i + k])) == free[i:i + k] and all(free[j:j + k] != free[i:i + k] for j in range(i)))
        word = text(free[i:i + k])
        got = post(url, "/v1/completions", {**long, "bad_words": [word], "return_token_ids": True}).json()
        ids = got["choices"][0]["token_ids"]
        assert ids[:i + k - 1] == free[:i + k - 1] and ids[i + k - 1] != free[i + k - 1], (k, word, free, ids)
        assert all(ids[j:j + k] != free[i:i + k] for j in range(len(ids))), (k, word, ids)
    # nothing left to sample: the request fails alone, saying why
    dead = post(url, "/v1/completions", {**base, "allowed_token_ids": [5], "regex": "x+"})
    assert dead.status_code == 400 and "allowed_token_ids" in dead.json()["error"]["message"], dead.text
    assert post(url, "/v1/completions", base).json()["choices"][0]["text"]
    for bad, field in (({"allowed_token_ids": []}, "allowed_token_ids"), ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
                       ({"bad_words": [""]}, "bad_words"), ({"bad_words": ["x"] * 200}, "bad_words"),
                       ({"bad_words": [" "]}, "bad_words")):
        r = post(url, "/v1/completions", {**base, **bad})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (bad, r.text)


def test_beam_search_as_vllm_runs_it(url):
    """vLLM's use_beam_search: n beams; width 1 is greedy; with width 2 over 2 tokens the best choice is the best
    pair among the 2 most likely first tokens, each followed by its most likely second token; the choices are best
    first, each token's logprob the model's; fields that do not apply to it are 400s."""
    ids = prompt_ids(31, 7)
    greedy = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 5, "return_token_ids": True, **GREEDY}).json()
    one = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 5, "use_beam_search": True, "n": 1,
                                        "ignore_eos": True, "return_token_ids": True}).json()
    assert one["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"]
    body = {"prompt": ids, "max_tokens": 2, "use_beam_search": True, "n": 2, "ignore_eos": True, "logprobs": 1,
            "return_token_ids": True, "length_penalty": 0.0}
    r = post(url, "/v1/completions", body).json()
    first = _gen(url, input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 1}, return_logprob=True,
                 top_logprobs_num=2)["meta_info"]["output_top_logprobs"][0]
    pairs = []
    for lp1, t1, _ in first:
        lp2, t2, _ = _gen(url, input_ids=ids + [t1], sampling_params={**GREEDY, "max_new_tokens": 1},
                          return_logprob=True, top_logprobs_num=1)["meta_info"]["output_top_logprobs"][0][0]
        pairs.append((lp1 + lp2, [t1, t2]))
    best = max(pairs)
    got = r["choices"][0]
    assert got["token_ids"] == best[1] and sum(got["logprobs"]["token_logprobs"]) == pytest.approx(best[0], abs=1e-4)
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in r["choices"]]
    assert sums == sorted(sums, reverse=True) and len({tuple(c["token_ids"]) for c in r["choices"]}) == 2
    assert r["usage"]["completion_tokens"] == 4 and r["usage"]["prompt_tokens"] == len(ids)
    # two prompts, chat
    two = post(url, "/v1/completions", {**body, "prompt": [ids, prompt_ids(32, 4)], "logprobs": None}).json()
    assert len(two["choices"]) == 4 and two["choices"][0]["token_ids"] == best[1]
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                                              "use_beam_search": True, "n": 2}).json()
    assert len(chat["choices"]) == 2 and all(c["finish_reason"] in ("stop", "length") for c in chat["choices"])
    for bad, says in (({"stream": True}, "streamed"), ({"temperature": 0.7}, "temperature"), ({"stop": ["x"]}, "stop"),
                      ({"regex": "a+"}, "regex"), ({"use_beam_search": False}, "length_penalty"),
                      ({"echo": True}, "echo"), ({"length_penalty": "x"}, "length_penalty")):
        r = post(url, "/v1/completions", {**body, **bad})
        assert r.status_code == 400 and says in r.json()["error"]["message"], (bad, r.text)


def test_vllm_prompt_and_id_fields(url):
    """vLLM's add_special_tokens, truncate_prompt_tokens / truncation_side, return_tokens_as_token_ids, request_id and
    chat's return_token_ids (prompt ids beside the choices, streamed in the first chunk); its fields this server does
    not serve are 400s naming them, their unused values pass."""
    text = "The sea is wide and the sky is blue"
    full = post(url, "/tokenize", {"prompt": text}).json()["tokens"]
    assert full[0] == 2 and len(full) > 6

    def completion(**extra):
        r = post(url, "/v1/completions", {"prompt": text, "max_tokens": 2, "return_token_ids": True, **GREEDY, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    assert completion()["choices"][0]["prompt_token_ids"] == full
    assert completion(add_special_tokens=False)["choices"][0]["prompt_token_ids"] == full[1:]
    assert completion(truncate_prompt_tokens=4)["choices"][0]["prompt_token_ids"] == [2, *full[-3:]]
    assert completion(truncate_prompt_tokens=4, truncation_side="right")["choices"][0]["prompt_token_ids"] == full[:4]
    assert completion(truncate_prompt_tokens=-1)["choices"][0]["prompt_token_ids"] == full
    ids = post(url, "/v1/completions", {"prompt": full, "max_tokens": 1, "truncate_prompt_tokens": 3, "echo": True,
                                        "return_token_ids": True, **GREEDY}).json()["choices"][0]
    assert ids["prompt_token_ids"] == full[-3:]
    cut = completion(truncate_prompt_tokens=3, echo=True, max_tokens=0)["choices"][0]
    assert cut["text"] == httpx.post(url + "/detokenize", json={"tokens": [2, *full[-2:]]}).json()["prompt"]
    r = post(url, "/v1/completions", {"prompt": text, "truncate_prompt_tokens": 10**6})
    assert r.status_code == 400 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    # token ids as labels; the response id from request_id
    lp = completion(logprobs=2, return_tokens_as_token_ids=True, request_id="abc")
    assert lp["id"] == "cmpl-abc"
    ch = lp["choices"][0]
    assert ch["logprobs"]["tokens"] == [f"token_id:{t}" for t in ch["token_ids"]]
    assert all(k.startswith("token_id:") for top in ch["logprobs"]["top_logprobs"] for k in top)
    # chat: token ids, the prompt's beside the choices, and add_special_tokens on top of the template's bos
    msgs = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **GREEDY}
    prompt = post(url, "/tokenize", {"messages": msgs["messages"], "add_generation_prompt": True}).json()["tokens"]
    chat = post(url, "/v1/chat/completions", {**msgs, "return_token_ids": True, "request_id": "q"}).json()
    assert chat["id"] == "chatcmpl-q" and chat["prompt_token_ids"] == prompt
    assert len(chat["choices"][0]["token_ids"]) == chat["usage"]["completion_tokens"]
    more = post(url, "/v1/chat/completions", {**msgs, "add_special_tokens": True, "return_token_ids": True}).json()
    assert more["prompt_token_ids"] == [2, *prompt]
    sse = post_stream(url, "/v1/chat/completions", {**msgs, "return_token_ids": True, "stream": True})
    assert sse.events[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in e for e in sse.events[1:])
    assert [t for e in sse.events for c in e["choices"] for t in c.get("token_ids", [])] == chat["choices"][0]["token_ids"]
    lab = post(url, "/v1/chat/completions", {**msgs, "logprobs": True, "return_tokens_as_token_ids": True}).json()
    assert [c["token"] for c in lab["choices"][0]["logprobs"]["content"]] == \
        [f"token_id:{t}" for t in chat["choices"][0]["token_ids"]]
    for field, value in (("extra_key", "tenant-a"), ("priority", 1), ("reasoning_effort", "low"),
                         ("include_reasoning", False), ("chat_template", "{{ 1 }}"), ("logprob_token_ids", [1]),
                         ("stream_interval", 4), ("kv_transfer_params", {"a": 1}), ("stop_regex", "a+"),
                         ("separate_reasoning", False), ("return_meta_info", True), ("lora_path", "x")):
        r = post(url, "/v1/chat/completions", {**msgs, field: value})
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
    ok = post(url, "/v1/chat/completions", {**msgs, "priority": 0, "include_reasoning": True, "session_id": "s1",
                                            "spaces_between_special_tokens": True, "lora_path": None,
                                            "return_cached_tokens_details": True})
    assert ok.status_code == 200, ok.text
    # SGLang's json_schema on the OpenAI routes
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    js = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 3, "json_schema": json.dumps(schema), **GREEDY})
    assert js.status_code == 200 and js.json()["choices"][0]["text"].startswith("{")
    two = post(url, "/v1/completions", {"prompt": "x", "json_schema": schema, "regex": "a"})
    assert two.status_code == 400 and "json_schema" in two.json()["error"]["message"]


def test_include_stop_str_in_output_keeps_the_stop_string(url):
    body = {"prompt": prompt_ids(26, 6), "max_tokens": 12, **GREEDY}
    full = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    stop = next(c for c in full[2:] if c.isascii() and c.isalnum())  # (a token may be part of a UTF-8 character)
    for flag in ("include_stop_str_in_output", "no_stop_trim"):
        kept = post(url, "/v1/completions", {**body, "stop": [stop], flag: True}).json()["choices"][0]
        assert kept["finish_reason"] == "stop" and kept["text"].endswith(stop) and full.startswith(kept["text"])


def test_stream_continuous_usage_stats(url):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage so far, the last one the
    whole; include_usage's final usage chunk is unchanged."""
    for path, body in (("/v1/completions", {"prompt": prompt_ids(27, 5)}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        sse = post_stream(url, path, {**body, "max_tokens": 4, **GREEDY,
                                      "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        chunks = [ev for ev in sse.events if ev["choices"]]
        done = [ev["usage"]["completion_tokens"] for ev in chunks]
        assert done == sorted(done) and done[-1] == 4 and all(ev["usage"]["prompt_tokens"] > 0 for ev in chunks)
        final = sse.events[-1]
        assert final["choices"] == [] and final["usage"]["completion_tokens"] == 4
        plain = post_stream(url, path, {**body, "max_tokens": 4, **GREEDY, "stream_options": {"include_usage": True}})
        assert all(ev["usage"] is None for ev in plain.events if ev["choices"])


def test_chat_stop_string_trims_like_the_engine(url):
    client = openai_client(url)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Tell me a story."}]
    full = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    if len(full) < 6:
        pytest.skip(f"greedy output too short for a stop string: {full!r}")
    stop = next(c for c in full[2:] if c.isascii() and c.isalnum())  # (a token may be part of a UTF-8 character)
    cut = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == full[: full.index(stop)]


def test_chat_template_errors_are_400(url):
    r = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    assert r.status_code == 400 and "alternate" in r.json()["error"]["message"]


def test_unknown_route_is_json_404(url):
    r = httpx.get(url + "/no/such/route")
    assert r.status_code == 404 and "message" in r.json()["error"]


def test_abort_request_by_rid(url):
    body = {"input_ids": prompt_ids(7, 5), "rid": "abort-me", "sampling_params": {**GREEDY, "max_new_tokens": 400}}
    aborted, r = while_generating(url, body, lambda: post(url, "/abort_request", {"rid": "abort-me"}))
    assert aborted.status_code == 200
    out = r.json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and out["meta_info"]["completion_tokens"] < 400
    assert post(url, "/abort_request", {}).status_code == 400


def test_flush_cache_when_idle(url):
    _gen(url, input_ids=prompt_ids(8, 9), sampling_params={**GREEDY, "max_new_tokens": 1})
    cached = _gen(url, input_ids=prompt_ids(8, 9), sampling_params={**GREEDY, "max_new_tokens": 1})
    assert cached["meta_info"]["cached_tokens"] > 0
    assert httpx.post(url + "/flush_cache").status_code == 200
    fresh = _gen(url, input_ids=prompt_ids(8, 9), sampling_params={**GREEDY, "max_new_tokens": 1})
    assert fresh["meta_info"]["cached_tokens"] == 0


def test_event_loop_is_not_blocked_by_generation(url):
    """/health (and an abort) are answered while a long generation runs: the generation is cut short, so the
    answers came before its work was done. Counted in tokens, not seconds (a shared machine stalls any clock);
    the timeouts only guard against a hang."""
    body = {"input_ids": prompt_ids(9, 5), "rid": "loop-free", "stream": True,
            "sampling_params": {**GREEDY, "max_new_tokens": 480}}  # the context (512) holds it
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        lines = r.iter_lines()
        next(lines)
        assert httpx.get(url + "/health", timeout=60).status_code == 200
        assert post(url, "/abort_request", {"rid": "loop-free"}).status_code == 200
        last = [json.loads(x[6:]) for x in lines if x.startswith("data: {")][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 480


def test_generate_stream_openai_n2_indexes(url):
    sse = post_stream(url, "/generate", {"input_ids": [prompt_ids(10, 3), prompt_ids(11, 4)],
                                         "sampling_params": {**GREEDY, "max_new_tokens": 2}})
    finals = {ev["index"]: ev for ev in sse.events if ev["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1] and finals[1]["meta_info"]["prompt_tokens"] == 4


def test_sglang_bench_serving_payload(url):
    """The payload SGLang's bench_serving (--backend sglang) sends, read the way it reads it."""
    payload = {"text": "Hello there, how are", "sampling_params": {"temperature": 0.0, "max_new_tokens": 5,
                                                                   "ignore_eos": True},
               "stream": True, "stream_options": {"include_usage": True}, "lora_path": None, "image_data": None,
               "return_logprob": False, "logprob_start_len": -1}
    with httpx.stream("POST", url + "/generate", json=payload, timeout=60) as r:
        assert r.status_code == 200
        chunks = [line[len("data: "):] for line in r.iter_lines() if line.strip()]
    assert chunks[-1] == "[DONE]"
    data = [json.loads(c) for c in chunks[:-1]]
    assert data[-1]["meta_info"]["completion_tokens"] == 5 and data[-1]["meta_info"]["prompt_tokens"] > 0
    assert all(data[-1]["text"].startswith(d["text"]) for d in data)
