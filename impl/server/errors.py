"""Error responses: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape).

Bad input is a 4xx whose message names the field; nothing a client sends
should produce a 500. ``parse_json`` validates a raw body against a request
model (malformed JSON, nesting deeper than 200 levels, invalid UTF-8 and lone
UTF-16 surrogates are refused by pydantic's JSON parser with a 400);
``install_error_handlers`` maps ``APIError``, ``ValueError`` from the engine's
validation, unknown routes (405s keep their ``Allow`` header) and anything
unexpected onto that shape.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("impl.server")

M = TypeVar("M", bound=BaseModel)

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
                404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestTooLargeError",
                415: "UnsupportedMediaTypeError", 429: "RateLimitError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_response(status: int, message: str, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _field_path(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'; union tags such as 'list[int]' are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or "-" in part or part in (
                "str", "int", "float", "bool", "dict", "list", "none", "literal")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


_TYPE_MISMATCH = frozenset({"model_type", "list_type", "string_type", "int_type", "bool_type", "float_type",
                            "dict_type", "literal_error", "none_required", "model_attributes_type"})


# fields whose items are token ids, bounded by the vocabulary (not by a server flag)
_TOKEN_IDS = frozenset({"prompt", "input_ids", "stop_token_ids"})


def validation_message(e: ValidationError | RequestValidationError) -> tuple[str, str]:
    """(field, message) of the first error, naming the field the client must fix (and the flag of a limit)."""
    from impl.server.limits import field_name, limit_hint

    errs = e.errors()
    # A union reports one error per branch: prefer one past the type check (the branch the client meant), and of
    # those the deepest: a list's length is checked before its items' types, so a branch whose items would not
    # even fit can report only its length (512 token ids against a batch of at most 64 strings), while the branch
    # the client meant names the item at fault (token id 600 at index 413, past the vocabulary).
    fits = [x for x in errs if x.get("type") not in _TYPE_MISMATCH]
    first = max(fits, key=lambda x: len(x.get("loc", ()))) if fits else errs[0]
    kind = first.get("type")
    loc = tuple(first.get("loc", ()))
    field = _field_path(loc)
    if kind == "json_invalid":
        return "body", (f"malformed JSON body: {first.get('msg', 'invalid')}; send one JSON object (UTF-8, at most "
                        "200 levels deep, no lone UTF-16 surrogates)")
    if kind == "model_type" and field == "body":
        return "body", "the request body must be a JSON object"
    if kind == "missing":
        return field, f"field '{field}' is required"
    msg = str(first.get("msg", "invalid"))
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        return field, msg if field == "body" else f"invalid value for field '{field}': {msg}"
    if kind == "less_than_equal" and loc and isinstance(loc[-1], int) and field_name(field) in _TOKEN_IDS:
        top = (first.get("ctx") or {}).get("le")
        return field, (f"invalid value for field '{field}': token id {first.get('input')} is outside the vocabulary "
                       f"(ids 0 to {top})")
    hint = limit_hint(field) if kind in ("less_than_equal", "too_long", "string_too_long") else ""
    return field, f"invalid value for field '{field}': {msg}{hint}"


def parse_json(raw: bytes, model: type[M]) -> M:
    """Validate a raw JSON body against ``model``; APIError(400) names the field (CPU-bound: run it off the loop)."""
    if not raw:
        raise APIError(400, "the request body is empty; send a JSON object", "body")
    try:
        return model.model_validate_json(raw)
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
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
