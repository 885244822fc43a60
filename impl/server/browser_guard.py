"""Browser-safe defaults: refuse foreign ``Host`` headers (DNS rebinding) and foreign ``Origin`` headers (CSRF).

A web page the operator visits can make the browser send requests to
``http://127.0.0.1:30000``; without a key, the server cannot tell them from the
operator's own. Two checks close that (as Jupyter and Ollama do), on every route:

* ``Host``: accepted when it is an IP literal, ``localhost`` (or a
  ``*.localhost`` name), the ``--host`` the server was bound to, or listed in
  ``--allowed-hosts`` (``*``: any). A DNS-rebinding page reaches the server
  under *its own* domain name, which none of these match.
* ``Origin`` (browsers send it on every cross-origin request and on every
  POST): accepted when absent (curl, SDKs), when it is the server's own origin
  (``http(s)://<Host>``), or when listed in ``--allowed-origins`` (``*``: any;
  listed origins also get CORS headers, so their pages can read the answers).

Refusals are 403 with the usual JSON error body naming the flag to set. A pure
ASGI middleware, so streaming and disconnect detection pass through untouched.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from impl.server.errors import error_response


def parse_list(value: str | None) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c') (lower-cased, trailing slashes dropped)."""
    if not value:
        return ()
    return tuple(p.strip().lower().rstrip("/") for p in value.split(",") if p.strip())


def host_name(host_header: str) -> str:
    """'[::1]:30000' -> '::1'; 'Example.com:80' -> 'example.com'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    if h.count(":") == 1:
        return h.split(":", 1)[0]
    return h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuardMiddleware:
    def __init__(self, app: ASGIApp, bound_host: str, allowed_hosts: str | None, allowed_origins: str | None):
        self.app = app
        self.bound_host = host_name(bound_host or "")
        self.allowed_hosts = parse_list(allowed_hosts)
        self.allowed_origins = parse_list(allowed_origins)

    def host_ok(self, host_header: str) -> bool:
        if "*" in self.allowed_hosts:
            return True
        name = host_name(host_header)
        return (_is_ip(name) or name == "localhost" or name.endswith(".localhost") or name == self.bound_host
                or name in self.allowed_hosts or host_header.strip().lower() in self.allowed_hosts)

    def origin_ok(self, origin: str, host_header: str) -> bool:
        o = origin.strip().lower().rstrip("/")
        if "*" in self.allowed_origins or o in self.allowed_origins:
            return True
        h = host_header.strip().lower()
        return bool(h) and o in (f"http://{h}", f"https://{h}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not self.host_ok(host):
            msg = (f"Host {host!r} is not served here (DNS-rebinding guard); use an IP address or localhost, or "
                   "start the server with --allowed-hosts NAME")
            await error_response(403, msg, "host")(scope, receive, send)
            return
        origin = headers.get(b"origin")
        if origin is not None and not self.origin_ok(origin.decode("latin-1"), host):
            msg = (f"Origin {origin.decode('latin-1')!r} may not call this server (cross-origin guard); start the "
                   "server with --allowed-origins ORIGIN to allow a web page")
            await error_response(403, msg, "origin")(scope, receive, send)
            return
        await self.app(scope, receive, send)
