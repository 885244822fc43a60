"""What a router or a data-parallel front reads from a worker: ``GET /get_load`` and the idle wait of
``/flush_cache``.

``/get_load`` has SGLang's shape: a JSON array with one entry per data-parallel
rank (``dp_rank``, ``num_reqs`` = running + waiting requests, ``num_waiting_reqs``,
``num_tokens`` = KV-cache tokens in use). ``sglang-router`` polls it for its load-aware policies
(``power_of_two``, ``cache_aware``'s balance check) and its ``/get_loads``.
A single server is rank 0; the ``--dp-size`` front (``impl.server.dp_relay``)
asks every replica and renumbers the entries.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable

from fastapi import FastAPI

from impl.engine.engine import Engine

FLUSH_POLL_S = 0.05


def load_entry(engine: Engine, dp_rank: int = 0) -> dict[str, Any]:
    """One rank's ``/get_load`` entry, read from ``Engine.load()``."""
    load = engine.load()
    return {"dp_rank": dp_rank, "num_reqs": load.num_reqs, "num_waiting_reqs": load.num_waiting_reqs,
            "num_tokens": load.kv_tokens_used}


def add_cluster_routes(app: FastAPI, engine: Engine) -> None:
    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        return [load_entry(engine)]


async def flush_when_idle(flush: Callable[[], bool], timeout: float) -> bool:
    """Call ``flush`` (off the event loop) until it succeeds or ``timeout`` seconds have passed (SGLang's
    ``/flush_cache?timeout=S``: wait for the server to go idle, then flush). True when flushed."""
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"invalid value for 'timeout': {timeout}; pass ?timeout=SECONDS, a number >= 0")
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while True:
        if await loop.run_in_executor(None, flush):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(FLUSH_POLL_S)
