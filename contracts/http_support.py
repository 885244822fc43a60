"""Shared pieces of the HTTP contracts: the launch lines, an SSE reader, small clients.

No contracts live here. The contracts talk HTTP only (httpx and the official
``openai`` client), so they run unchanged against any server at a URL.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import httpx

from contracts.sse_client import sse_lines

# Every HTTP contract launches one of these (the ``impl`` subject caches one server per argv).
# torch_native decode on both, so fast prefill on vs off differs only in the prefill path.
ARGV_OFF = ["--decode-attention-backend", "torch_native", "--context-length", "512", "--max-total-tokens", "4096"]
ARGV_ON = [*ARGV_OFF, "--kv-sharing-fast-prefill"]
TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def prompt_ids(seed: int, length: int, vocab: int = 256) -> list[int]:
    """A deterministic prompt of ``length`` ordinary token ids (ids 16.. avoid special tokens)."""
    return [16 + (seed * 7919 + i * 104729) % (vocab - 16) for i in range(length)]


@dataclass
class SSE:
    events: list[Any] = field(default_factory=list)  # parsed JSON objects, in order
    done: bool = False  # saw data: [DONE] as the last event
    after_done: int = 0  # events after [DONE] (must be 0)
    raw: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Any | None:
        """Take one line of the stream; the JSON event it carries (also appended to ``events``), else None (a
        blank line, ``[DONE]``, or anything after it, which is counted)."""
        if not line.strip():
            return None
        self.raw.append(line)
        if not line.startswith("data: "):
            raise ValueError(f"an SSE line must start with 'data: ', got {line[:80]!r}")
        data = line[len("data: "):]
        if self.done:
            self.after_done += 1
            return None
        if data == "[DONE]":
            self.done = True
            return None
        ev = json.loads(data)
        self.events.append(ev)
        return ev


def read_sse(lines: Iterable[str]) -> SSE:
    out = SSE()
    for line in lines:
        out.feed(line)
    return out


def post(url: str, path: str, body: Any, timeout: httpx.Timeout = TIMEOUT, **kw: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout, **kw)


def post_stream(url: str, path: str, body: dict[str, Any]) -> SSE:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=TIMEOUT) as r:
        if r.status_code != 200:
            r.read()
            raise AssertionError(f"POST {path} (stream) answered {r.status_code}: {r.text[:300]}")
        return read_sse(sse_lines(r.iter_text()))


def get_json(url: str, path: str) -> Any:
    r = httpx.get(url + path, timeout=TIMEOUT)
    r.raise_for_status()
    return r.json()


@functools.lru_cache(maxsize=None)
def gateway_of(url: str) -> str | None:
    """'sglang-router' when ``url`` is an sglang-router gateway (it lists its workers at GET /workers), else None."""
    try:
        r = httpx.get(url + "/workers", timeout=TIMEOUT)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return "sglang-router" if isinstance(body, dict) and isinstance(body.get("workers"), list) else None


def model_name(url: str) -> str:
    return get_json(url, "/v1/models")["data"][0]["id"]


def openai_client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", timeout=120.0, max_retries=0)


def metrics(url: str) -> dict[str, float]:
    """``{'name{labels}': value}`` from GET /metrics, with the labels dropped (one model per server)."""
    r = httpx.get(url + "/metrics", timeout=TIMEOUT)
    r.raise_for_status()
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        le = [p for p in labels.rstrip("}").split(",") if p.startswith("le=")]
        out[name + (f"{{{le[0]}}}" if le else "")] = float(value)
    return out
