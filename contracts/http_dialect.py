"""What a server at a URL offers, found out once (``discover``), and one way to ask it for a completion.

A server speaks this project's dialect (SGLang's native routes: ``POST /generate``, ``/get_model_info``,
``/get_server_info``, ``sglang:*`` metrics) or only the OpenAI routes (vLLM: ``/v1/completions``,
``/v1/chat/completions``, ``vllm:*`` metrics). The HTTP contracts use native routes where the server has them and
the OpenAI routes where it does not, and say what they could not check (``contracts.base.note``) or that the
rule cannot be shown at all (``inconclusive``).

Discovery reads routes without generating anything except one 1-token completion that tells whether the server
returns output token ids (vLLM's ``return_token_ids``). No contracts live here.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.sse_client import sse_lines

TIMEOUT = httpx.Timeout(120.0, connect=10.0)


@dataclass(frozen=True)
class MetricNames:
    """One server family's Prometheus names for what the HTTP contracts count (None: it has no such metric)."""

    family: str
    prompt_tokens: str
    generation_tokens: str
    ttft: str  # histogram (its _count moves once per request)
    tpot: str | None  # per-request histogram
    e2e: str
    running: str
    waiting: str
    kv_usage: str  # 0..1
    cache_hit: str
    aborted: tuple[str, dict[str, str]] | None  # counter name, label filter
    skipped_rows: str | None  # this project's fast-prefill counter
    forwards: str | None  # a count of engine steps (histogram _count), when the server exports one
    # an info gauge whose labels are the resolved cache config (vLLM: vllm:cache_config_info, one label per
    # CacheConfig field, kv_sharing_fast_prefill among them): (metric name, the flag's label)
    config_info: tuple[str, str] | None = None


SGLANG_METRICS = MetricNames(
    "sglang", "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds",
    "sglang:time_per_output_token_seconds", "sglang:e2e_request_latency_seconds", "sglang:num_running_reqs",
    "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate", ("sglang:num_aborted_requests_total", {}),
    "yoco:skipped_cross_decoder_rows_total", None,
)
VLLM_METRICS = MetricNames(
    "vllm", "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
    ("vllm:request_success_total", {"finished_reason": "abort"}), None, "vllm:iteration_tokens_total",
    ("vllm:cache_config_info", "kv_sharing_fast_prefill"),
)


@dataclass(frozen=True)
class ServerApi:
    url: str
    model: str  # the served model id (GET /v1/models)
    native: bool  # POST /generate exists
    server_info: dict[str, Any] | None  # GET /get_server_info (or /server_info), when it answers JSON
    model_info: dict[str, Any] | None  # GET /get_model_info
    context_length: int | None
    vocab_size: int | None
    metrics: MetricNames | None
    token_ids: bool  # /v1/completions returns output token ids (return_token_ids)
    version: str | None
    model_root: str | None  # the served folder on this machine, when the server says where it is
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        if self.metrics is not None:
            return self.metrics.family
        return "sglang" if self.native else "openai"

    def hf_config(self) -> dict[str, Any] | None:
        """The served checkpoint's config.json, when the server names a folder that exists on this machine."""
        if self.model_root and os.path.isfile(os.path.join(self.model_root, "config.json")):
            with open(os.path.join(self.model_root, "config.json")) as f:
                return json.load(f)
        return None


def _json(r: httpx.Response) -> Any:
    try:
        return r.json() if r.status_code == 200 else None
    except ValueError:
        return None


@functools.lru_cache(maxsize=None)
def discover(url: str) -> ServerApi:
    url = url.rstrip("/")
    with httpx.Client(timeout=TIMEOUT) as c:
        models = _json(c.get(url + "/v1/models")) or {}
        entry = (models.get("data") or [{}])[0]
        model = entry.get("id") or "default"
        model_info = _json(c.get(url + "/get_model_info"))
        server_info = None
        for path in ("/get_server_info", "/server_info"):
            server_info = _json(c.get(url + path))
            if isinstance(server_info, dict):
                break
            server_info = None
        probe = c.post(url + "/generate", json={})
        native = probe.status_code not in (404, 405)
        text = c.get(url + "/metrics")
        names = None
        if text.status_code == 200:
            if "sglang:" in text.text:
                names = SGLANG_METRICS
            elif "vllm:" in text.text:
                names = VLLM_METRICS
        version = (_json(c.get(url + "/version")) or {}).get("version") if not native else None
        if version is None and isinstance(server_info, dict):
            version = server_info.get("version")
        r = c.post(url + "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                                                   "return_token_ids": True})
        choice = ((_json(r) or {}).get("choices") or [{}])[0]
        token_ids = isinstance(choice.get("token_ids"), list)
    root = entry.get("root") if isinstance(entry.get("root"), str) else None
    ctx = (model_info or {}).get("context_length") or entry.get("max_model_len")
    api = ServerApi(url, model, native, server_info, model_info, int(ctx) if ctx else None, None, names, token_ids,
                    version, root)
    vocab = (model_info or {}).get("vocab_size")
    if vocab is None:
        cfg = api.hf_config() or {}
        vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return ServerApi(**{**api.__dict__, "vocab_size": int(vocab) if vocab else None})


# ---------------------------------------------------------------- Prometheus samples, labels kept


# one label: name="value", the value with Prometheus' escapes (\\ \" \n); values may hold commas and spaces
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """One Prometheus text-format sample line as (name, labels, value); None for comments and unparsable lines."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    labels: dict[str, str] = {}
    if brace < 0:
        name, _, rest = line.partition(" ")
    else:
        name, pos = line[:brace], brace + 1
        while True:
            m = _LABEL.match(line, pos)
            if m is None:
                break
            labels[m.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
            pos = m.end()
        if not line.startswith("}", pos):
            return None
        rest = line[pos + 1:]
    fields = rest.split()
    try:
        return (name.strip(), labels, float(fields[0])) if fields else None
    except ValueError:
        return None


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    r = httpx.get(url + "/metrics", timeout=TIMEOUT)
    r.raise_for_status()
    return [s for s in map(parse_sample, r.text.splitlines()) if s is not None]


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels`` (histogram buckets excluded); None if absent."""
    vals = [v for n, ls, v in samples if n == name and "le" not in ls and all(ls.get(k) == x for k, x in labels.items())]
    return sum(vals) if vals else None


# ---------------------------------------------------------------- one completion, either dialect


@dataclass
class Completion:
    text: str
    ids: list[int] | None  # output token ids, when the route returns them
    finish_reason: Any
    prompt_tokens: int | None
    completion_tokens: int | None
    chunks: int = 0  # streamed: events with new content
    done: bool = True  # streamed: ended with data: [DONE]


def _native_body(prompt: list[int] | str, max_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    sp = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True, **extra}
    return {("text" if isinstance(prompt, str) else "input_ids"): prompt, "sampling_params": sp}


def _openai_body(api: ServerApi, prompt: list[int] | str, max_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    body = {"model": api.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            **extra}
    if api.token_ids:
        body["return_token_ids"] = True
    return body


class ServerAnswer(AssertionError):
    """The server answered a request the contracts consider valid with an error status (a verdict about it)."""


def complete(api: ServerApi, prompt: list[int] | str, max_tokens: int, **extra: Any) -> Completion:
    """One greedy completion (EOS ignored) through /generate where the server has it, else /v1/completions."""
    if api.native:
        r = httpx.post(api.url + "/generate", json=_native_body(prompt, max_tokens, extra), timeout=TIMEOUT)
        if r.status_code != 200:
            raise ServerAnswer(f"POST /generate answered {r.status_code}: {r.text[:300]}")
        out = r.json()
        m = out["meta_info"]
        return Completion(out["text"], list(out["output_ids"]), m["finish_reason"], m.get("prompt_tokens"),
                          m.get("completion_tokens"))
    r = httpx.post(api.url + "/v1/completions", json=_openai_body(api, prompt, max_tokens, extra), timeout=TIMEOUT)
    if r.status_code != 200:
        raise ServerAnswer(f"POST /v1/completions answered {r.status_code}: {r.text[:300]}")
    out = r.json()
    ch, usage = out["choices"][0], out.get("usage") or {}
    return Completion(ch["text"], ch.get("token_ids"), ch.get("finish_reason"), usage.get("prompt_tokens"),
                      usage.get("completion_tokens"))


def complete_stream(api: ServerApi, prompt: list[int] | str, max_tokens: int, **extra: Any) -> Completion:
    """The same request streamed: native events carry cumulative text and ids; OpenAI chunks carry deltas."""
    if api.native:
        path, body = "/generate", {**_native_body(prompt, max_tokens, extra), "stream": True}
    else:
        path = "/v1/completions"
        body = {**_openai_body(api, prompt, max_tokens, extra), "stream": True, "stream_options": {"include_usage": True}}
    text, ids, reason, usage, chunks, done = "", [], None, {}, 0, False
    with httpx.stream("POST", api.url + path, json=body, timeout=TIMEOUT) as r:
        if r.status_code != 200:
            r.read()
            raise ServerAnswer(f"POST {path} (stream) answered {r.status_code}: {r.text[:300]}")
        for line in sse_lines(r.iter_text()):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if api.native:
                text, ids, reason = ev["text"], list(ev["output_ids"]), ev["meta_info"]["finish_reason"]
                usage = {"prompt_tokens": ev["meta_info"].get("prompt_tokens"),
                         "completion_tokens": ev["meta_info"].get("completion_tokens")}
                chunks += 1
                continue
            for ch in ev.get("choices") or []:
                text += ch.get("text") or ""
                ids += ch.get("token_ids") or []
                reason = ch.get("finish_reason") or reason
                chunks += 1
            usage = ev.get("usage") or usage
    return Completion(text, ids if (api.native or api.token_ids) else None, reason, usage.get("prompt_tokens"),
                      usage.get("completion_tokens"), chunks, done)


def stream_body(api: ServerApi, prompt: list[int] | str, max_tokens: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    """(path, body) of a streamed greedy request in the server's dialect (for clients that read the stream themselves)."""
    if api.native:
        return "/generate", {**_native_body(prompt, max_tokens, extra), "stream": True}
    return "/v1/completions", {**_openai_body(api, prompt, max_tokens, extra), "stream": True}
