"""SGLang's ``POST /pause_generation`` and ``POST /continue_generation`` (what RL trainers call around a weight
update; ``impl/engine/control.py``).

``{"mode": "abort" | "retract" | "in_place"}`` (default ``abort``): the requests in flight are aborted (each
answered with finish_reason abort), retracted to the waiting queue (their KV freed, prefilled again after), or
kept as they are; until ``/continue_generation`` no forward runs and new requests wait in the queue (a client's
abort still applies). ``/get_server_info`` has ``paused`` (the mode, or null); ``/health_generate`` answers 503
while paused, as ``GET /ready`` does (SGLang's readiness: ``{"status": "ready"}`` when healthy and not paused,
else a 503 saying why). Answers are SGLang's JSON, with the mode and how many requests it aborted, retracted or
kept. ``continue_generation``'s ``torch_empty_cache`` (CUDA's allocator) is accepted and has nothing to do on CPU.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI, Request

from impl.engine.engine import Engine
from impl.server.errors import error_response
from impl.server.intake import off_loop, read_optional_body
from impl.server.limits import RequestLimits
from impl.server.protocol import _Body


class PauseBody(_Body):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueBody(_Body):
    torch_empty_cache: bool = True


def add_pause_routes(app: FastAPI, engine: Engine, limits: RequestLimits) -> None:
    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        """SGLang's: no forward runs until /continue_generation (``impl/server/pause_api.py``)."""
        body = await read_optional_body(request, limits, PauseBody)
        n = await off_loop(lambda: engine.pause_generation(body.mode))  # waits for the step in progress
        return {"message": "Generation paused successfully.", "status": "ok", "mode": body.mode,
                {"abort": "aborted", "retract": "retracted", "in_place": "kept"}[body.mode]: n}

    @app.get("/ready")
    async def ready():
        """SGLang's: whether this server takes new requests now (healthy and not paused)."""
        reason = engine.health()
        if reason is not None or engine.paused is not None:
            why = f"unhealthy: {reason}" if reason is not None else f"generation is paused ({engine.paused})"
            return error_response(503, f"not ready: {why}")
        return {"status": "ready"}

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        await read_optional_body(request, limits, ContinueBody)
        engine.continue_generation()
        return {"message": "Generation continued successfully.", "status": "ok"}
