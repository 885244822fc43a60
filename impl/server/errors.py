"""Error responses: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape).

Bad input is a 400 whose message names the field; nothing a client sends
should produce a 500. ``parse_body`` turns malformed JSON and pydantic type
errors into ``APIError``; ``install_error_handlers`` maps ``APIError``,
``ValueError`` from the engine's validation, unknown routes and anything
unexpected onto that shape.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("impl.server")

M = TypeVar("M", bound=BaseModel)

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "InternalServerError"), "param": param,
                      "code": status}}
    return JSONResponse(body, status_code=status)


def _field_path(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'; union tags such as 'list[int]' are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "dict", "list", "none")):
            break
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def validation_message(e: ValidationError | RequestValidationError) -> tuple[str, str]:
    """(field, message) of the first error, naming the field the client must fix."""
    errs = e.errors()
    first = errs[0]
    field = _field_path(tuple(first.get("loc", ())))
    if first.get("type") == "missing":
        return field, f"field '{field}' is required"
    return field, f"invalid value for field '{field}': {first.get('msg', 'invalid')}"


async def parse_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        data = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"malformed JSON body: {e}; send a JSON object") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        field, msg = validation_message(e)
        raise APIError(400, msg, field) from None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError):
        return error_response(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        field, msg = validation_message(exc)
        return error_response(400, msg, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
