"""SGLang's ``POST /update_weights_from_disk``, ``POST /update_weight_version`` (``{"new_version"}``: names the
served weights, which stay) and ``GET /get_weight_version`` (``impl/engine/control.py``).

``{"model_path": <a checkpoint folder of the served model's architecture>, "abort_all_requests": false,
"weight_version": null, "flush_cache": true, "load_format": null}``: the new weights are loaded as the served
ones were (dtype, ``--torchao-config`` quantization, packing) beside them and swapped in between two steps; the
radix cache is flushed. With requests in flight, pause first (``/pause_generation``) or abort them
(``abort_all_requests``). Answers SGLang's ``{"success", "message", "num_paused_requests"}``: 200, or 400 with
``success`` false (a checkpoint of another architecture, an unreadable one, requests in flight, speculative
decoding on), the served weights then unchanged. The tokenizer stays (as in SGLang). Peak memory while loading:
both sets of weights.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from impl.engine.engine import Engine
from impl.server.errors import parse_json
from impl.server.intake import off_loop, read_body
from impl.server.limits import RequestLimits
from impl.server.protocol import _Body


class WeightVersionBody(_Body):
    new_version: Annotated[str, Field(min_length=1, max_length=256)]
    abort_all_requests: bool = False


class UpdateWeightsBody(_Body):
    model_path: Annotated[str, Field(min_length=1, max_length=4096)]
    load_format: Optional[Literal["auto", "safetensors"]] = None
    abort_all_requests: bool = False
    weight_version: Optional[Annotated[str, Field(min_length=1, max_length=256)]] = None
    flush_cache: bool = True


def add_weights_routes(app: FastAPI, engine: Engine, limits: RequestLimits) -> None:
    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        """SGLang's: serve another checkpoint's weights (``impl/server/weights_api.py``)."""
        body = parse_json(await read_body(request, limits), UpdateWeightsBody)
        ok, message, paused = await off_loop(lambda: engine.update_weights_from_disk(
            body.model_path, body.abort_all_requests, body.weight_version, body.flush_cache))
        return JSONResponse({"success": ok, "message": message, "num_paused_requests": paused},
                            status_code=200 if ok else 400)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        """SGLang's: name the served weights' version (the weights stay)."""
        body = parse_json(await read_body(request, limits), WeightVersionBody)
        if body.abort_all_requests:
            engine.abort(None)
        engine.weight_version = body.new_version
        return {"success": True, "message": f"Weight version updated to {body.new_version}",
                "new_version": body.new_version}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": engine.weight_version}
