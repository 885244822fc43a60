"""``--api-key``: every route but /health (and its alias /ping) needs ``Authorization: Bearer <key>`` (401 otherwise).

A pure ASGI middleware (not ``BaseHTTPMiddleware``), so streaming responses and
client-disconnect detection pass through untouched.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from impl.server.errors import error_response

OPEN_PATHS = frozenset({"/health", "/ping"})  # (/ping: vLLM's name for /health)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(b"authorization", b"")
        if not secrets.compare_digest(given, self.expected):
            msg = ("missing 'Authorization: Bearer <key>' header" if not given else "invalid API key") + (
                "; this server was started with --api-key")
            await error_response(401, msg)(scope, receive, send)
            return
        await self.app(scope, receive, send)
