"""Answers given before the request body was read still reach a client that keeps sending.

A 413 decided from ``Content-Length`` or part-way through the body, a 401, 403,
404 or 415: the route answers without reading the rest of the body. When the
connection then closes (uvicorn closes after answering a request that says
``Connection: close``, as Python's urllib does) with unread bytes in the
socket, the kernel resets it, and a client still sending sees a connection
reset instead of the answer.

``BodyDrainMiddleware`` therefore reads and discards what is left of the body
before the answer's first byte goes out, up to ``DRAIN_MAX_BYTES`` and
``DRAIN_TIMEOUT_S``. Past either bound (or when the client waits for
``100 Continue`` and so never sent the body) the answer says
``Connection: close``: the connection cannot be reused, and a client still
pushing a body that large may see the reset. Nothing a route reads is held:
discarded chunks are dropped as they arrive.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A 20 MB body over the 8 MiB default limit drains in well under a second on loopback.
DRAIN_MAX_BYTES = 64 * 2**20
DRAIN_TIMEOUT_S = 10.0
_CLOSE = (b"connection", b"close")


class _Body:
    """What the app has received of one request's body."""

    def __init__(self, scope: Scope):
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length", b"").strip()
        self.declared = int(length) if length.isdigit() else None
        self.awaits_continue = headers.get(b"expect", b"").strip().lower() == b"100-continue"
        # no Content-Length and no Transfer-Encoding: a request without a body
        self.done = self.declared == 0 or (self.declared is None and b"transfer-encoding" not in headers)
        self.started = False  # the app asked for the body (uvicorn then sent any 100 Continue)
        self.received = 0

    def saw(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.started = True
            self.received += len(message.get("body", b""))
            self.done = self.done or not message.get("more_body", False)
        elif message["type"] == "http.disconnect":
            self.done = True

    async def drain(self, receive: Receive) -> bool:
        """Read and drop the rest of the body; False when it was not all read (the answer must close)."""
        if self.awaits_continue and not self.started:
            return False  # the client sends the body only after a 100 Continue; it will get the answer instead
        if self.declared is not None and self.declared - self.received > DRAIN_MAX_BYTES:
            return False
        dropped = 0
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not self.done:
            left = deadline - time.monotonic()
            if left <= 0 or dropped > DRAIN_MAX_BYTES:
                return False
            try:
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                return False
            dropped += len(message.get("body", b""))
            self.saw(message)
        return True


class BodyDrainMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(scope)

        async def receive_watched() -> Message:
            message = await receive()
            body.saw(message)
            return message

        async def send_after_drain(message: Message) -> None:
            if message["type"] == "http.response.start" and not body.done and not await body.drain(receive):
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        await self.app(scope, receive_watched, send_after_drain)
