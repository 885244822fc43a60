"""The OpenAPI document at ``/openapi.json``: each POST route's request model as its ``requestBody``.

The routes read their bodies themselves (``intake.read_body``: content type
and size checks first, then validation off the event loop), so FastAPI does
not see the models; ``install_openapi`` adds them: the models' JSON schemas
(with the server's limits baked in, ``protocol.request_models``) under
``components/schemas``, a ``requestBody`` for each route, and the error
answers every route can give (``{"error": {...}}``), so a schema-driven
client or fuzzer (schemathesis in ``tests/server/test_schemathesis.py``)
generates valid requests and can check every answer against the document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}

# One server-sent event: 'data: <JSON object>' (a chunk, or an error object), the last one 'data: [DONE]'.
SSE_EVENT: dict[str, Any] = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}

_ERRORS = {
    "400": "Invalid request: the message names the field to fix",
    "401": "Missing or wrong API key (servers started with --api-key)",
    "404": "No such item (a path parameter names something not served here)",
    "403": "Foreign Host or Origin header (see --allowed-hosts, --allowed-origins)",
    "413": "Body larger than --max-request-body-bytes",
    "415": "Body is not JSON (send Content-Type: application/json)",
    "500": "This request failed inside the engine (other requests are unaffected)",
    "503": "The engine is unhealthy or stopped",
}
_GET_ERRORS = ("401", "403", "503")


def _error(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorResponse")}}}}


def install_openapi(app: FastAPI, bodies: dict[str, type[BaseModel]], streaming: set[str]) -> None:
    """``bodies``: POST path -> its request model; ``streaming``: paths whose 200 may be ``text/event-stream``."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                             description="SGLang-native and OpenAI-compatible routes of the yoco-gemma4 engine.")
        models = sorted({m for m in bodies.values()}, key=lambda m: m.__name__)
        _, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.update(defs.get("$defs", {}))
        comps["ErrorResponse"] = ERROR_SCHEMA
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)  # bad input is a 400 here
                if method == "post" and path in bodies:
                    op["requestBody"] = {"required": True, "content": {"application/json": {
                        "schema": {"$ref": REF.format(model=bodies[path].__name__)}}}}
                    ok = responses.setdefault("200", {"description": "Successful Response"})
                    content = {"application/json": {"schema": {"type": ["object", "array"]}}}
                    if path in streaming:
                        content["text/event-stream"] = {"schema": SSE_EVENT}
                    ok["content"] = content
                    codes = _ERRORS
                else:  # a route with query parameters refuses bad ones (and /flush_cache a busy server) with 400,
                    # one with a path parameter names what is not there with 404
                    codes = {k: _ERRORS[k] for k in _GET_ERRORS + (("400",) if op.get("parameters") else ())
                             + (("404",) if "{" in path else ())}
                for code, desc in codes.items():
                    responses.setdefault(code, _error(desc))
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]
