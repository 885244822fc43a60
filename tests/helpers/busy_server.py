"""Acting on a server while one request is being generated."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

import httpx

from contracts.http_support import metrics, post

T = TypeVar("T")


def while_generating(url: str, body: dict, fn: Callable[[], T]) -> tuple[T, httpx.Response]:
    """Run ``fn()`` once ``body`` (a /generate request) is running; return (fn's result, its response).
    The waits only guard against a hang: the request is seen running, or 30 s pass and ``fn`` runs anyway."""
    result: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: result.setdefault("r", post(url, "/generate", body)))
    t.start()
    deadline = time.monotonic() + 30
    while metrics(url)["sglang:num_running_reqs"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    got = fn()
    t.join(60)
    return got, result["r"]
