"""What a router or a data-parallel front reads from a worker: ``GET /get_load`` and the idle wait of
``/flush_cache``.

``/get_load`` has SGLang's shape: a JSON array with one entry per data-parallel
rank (``dp_rank``, ``num_reqs`` = running + waiting requests, ``num_waiting_reqs``,
``num_tokens`` = KV-cache tokens in use). ``sglang-router`` polls it for its load-aware policies
(``power_of_two``, ``cache_aware``'s balance check) and its ``/get_loads``.
A single server is rank 0; the ``--dp-size`` front (``impl.server.dp_front``)
asks every replica and renumbers the entries.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable

from fastapi import FastAPI

from impl.server.async_engine import AsyncEngine

FLUSH_POLL_S = 0.05


def load_entry(aengine: AsyncEngine, dp_rank: int = 0) -> dict[str, Any]:
    engine = aengine.engine
    total = engine.runner.budget.num_tokens
    in_use = max(0, total - engine.scheduler.kv.available()) if total else 0
    waiting = aengine.num_waiting()
    return {"dp_rank": dp_rank, "num_reqs": aengine.num_running() + waiting, "num_waiting_reqs": waiting,
            "num_tokens": int(in_use)}


def add_cluster_routes(app: FastAPI, aengine: AsyncEngine) -> None:
    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        return [load_entry(aengine)]


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
