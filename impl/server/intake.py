"""The request intake of the HTTP routes: bounded body read, then parse + tokenize + expand off the event loop.

* ``read_body``: POST bodies are JSON: a ``Content-Type`` other than
  ``application/json`` (or ``+json``) is a 415 (an HTML form or a
  ``text/plain`` fetch, which a browser sends cross-origin without a
  preflight, never reaches a route); no ``Content-Type`` at all is read as
  JSON. Bodies over ``--max-request-body-bytes`` are a 413, refused from the
  ``Content-Length`` header or while reading, so at most that many bytes are
  ever held (the rest is read and dropped before the answer goes out, so a
  client still sending gets the 413: ``body_drain.py``).
* ``off_loop``: JSON validation, tokenization, chat templating and the
  expansion of a batch into requests run on a small thread pool, so the event
  loop (``/health``, other streams) never waits for input-sized work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Callable, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from impl.server.errors import APIError, parse_json
from impl.server.limits import RequestLimits

logger = logging.getLogger("impl.server")
T = TypeVar("T")

INTAKE_WORKERS = 4
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=INTAKE_WORKERS, thread_name_prefix="http-intake")


def is_json_content_type(value: str) -> bool:
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    ctype = request.headers.get("content-type")
    if ctype is not None and not is_json_content_type(ctype):
        raise APIError(415, f"POST bodies must be JSON: send 'Content-Type: application/json' (got {ctype!r})",
                       "content-type")
    cap = limits.max_request_body_bytes
    too_big = (f"the request body is larger than {cap} bytes (the server's --max-request-body-bytes); "
               "send a smaller request")
    length = request.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > cap:
        raise APIError(413, too_big, "body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise APIError(413, too_big, "body")
        chunks.append(chunk)
    return b"".join(chunks)


M = TypeVar("M", bound=BaseModel)


async def read_optional_body(request: Request, limits: RequestLimits, model: type[M]) -> M:
    """A control route's body, every field optional (SGLang's clients send none, or GET): ``model``'s defaults
    when the body is empty, else validated as ``read_body`` and ``parse_json`` do."""
    raw = await read_body(request, limits)
    return parse_json(raw, model) if raw.strip() else model()


async def off_loop(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the intake pool (exceptions propagate to the awaiting route)."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn)
