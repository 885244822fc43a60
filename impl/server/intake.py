"""The request intake of the HTTP routes: bounded body read, then parse + tokenize + expand off the event loop.

* ``read_body``: POST bodies are JSON: a ``Content-Type`` other than
  ``application/json`` (or ``+json``) is a 415 (an HTML form or a
  ``text/plain`` fetch, which a browser sends cross-origin without a
  preflight, never reaches a route); no ``Content-Type`` at all is read as
  JSON. Bodies over ``--max-request-body-bytes`` are a 413, refused from the
  ``Content-Length`` header or while reading, so at most that many bytes are
  ever held.
* ``off_loop``: JSON validation, tokenization, chat templating and the
  expansion of a batch into requests run on a small thread pool, so the event
  loop (``/health``, other streams) never waits for input-sized work.
* ``fit_prompt`` / ``check_context``: a prompt over the context, or prompt +
  ``max_new_tokens`` over it, is a 400 naming both numbers, unless
  ``--allow-auto-truncate`` (then the prompt keeps its first tokens and
  ``max_new_tokens`` is capped to the room left, SGLang's behaviour).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Callable, Sequence, TypeVar

from starlette.requests import Request

from impl.engine.req import Req
from impl.server.errors import APIError
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


async def off_loop(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the intake pool (exceptions propagate to the awaiting route)."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn)


def fit_prompt(ids: list[int], limits: RequestLimits, field: str) -> list[int]:
    """The prompt, truncated to the context under --allow-auto-truncate; a 400 naming both lengths otherwise."""
    room = limits.context_len - 1
    if len(ids) <= room:
        return ids
    if limits.allow_auto_truncate:
        logger.warning("prompt of %d tokens truncated to %d (--allow-auto-truncate)", len(ids), room)
        return ids[:room]
    raise APIError(400, f"'{field}': the prompt has {len(ids)} tokens, but the context holds {limits.context_len} "
                        f"(at most {room} prompt tokens plus 1 generated); shorten the prompt, or start the server "
                        "with --allow-auto-truncate", field)


TEXT_BOUND_SLACK = 2  # normalizers may shrink a text a little; refuse only far beyond the bound


def check_text_size(chars: int, max_token_chars: int, limits: RequestLimits, field: str) -> None:
    """Refuse, before tokenizing, a text that certainly has more tokens than the context holds.

    Every token covers at most ``max_token_chars`` characters, so a text of C characters has at least
    C / max_token_chars tokens. Under --allow-auto-truncate the caller truncates instead."""
    bound = TEXT_BOUND_SLACK * max_token_chars * limits.context_len
    if chars > bound and not limits.allow_auto_truncate:
        raise APIError(400, f"'{field}': the prompt has {chars} characters, at least {chars // max_token_chars} "
                            f"tokens, but the context holds {limits.context_len} tokens; shorten the prompt, or start "
                            "the server with --allow-auto-truncate", field)


def check_context(reqs: Sequence[Req], explicit_max_new_tokens: bool, limits: RequestLimits, name: str) -> None:
    """prompt + max_new_tokens must fit the context when the client chose max_new_tokens (400 naming both)."""
    for r in reqs:
        sp = r.sampling_params
        prompt = len(r.origin_input_ids)
        room = limits.context_len - prompt
        if sp.max_new_tokens <= room:
            continue
        if explicit_max_new_tokens and not limits.allow_auto_truncate:
            raise APIError(400, f"'{name}' = {sp.max_new_tokens} plus the prompt's {prompt} tokens is "
                                f"{prompt + sp.max_new_tokens} tokens, over the context length {limits.context_len}; "
                                f"ask for at most {room} new tokens, shorten the prompt, or start the server with "
                                "--allow-auto-truncate", name)
        sp.max_new_tokens = room
        sp.min_new_tokens = min(sp.min_new_tokens, room)
