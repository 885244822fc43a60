"""The middleware every HTTP app of the server wears: the single server's (``app.py``), each data-parallel
replica's (the same app) and the data-parallel front's (``dp_relay.py``).

From the outside in: ``BodyDrainMiddleware`` (``body_drain.py``: an early answer still reaches a client
that keeps sending), the browser guard (``browser_guard.py``: foreign ``Host`` and ``Origin`` headers
refused) with CORS for the ``--allowed-origins``, and the API key (``auth.py``) when ``--api-key`` is set.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from impl.server.auth import APIKeyMiddleware
from impl.server.body_drain import BodyDrainMiddleware
from impl.server.browser_guard import BrowserGuardMiddleware, parse_list


def install_guards(app: FastAPI, args: Any) -> None:
    """``args``: ServerArgs (``api_key``, ``host``, ``allowed_hosts``, ``allowed_origins``)."""
    # add_middleware wraps what is there: the last added is the outermost
    if args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=args.api_key)
    origins = parse_list(args.allowed_origins)
    if origins:  # listed origins may read the answers (CORS); the guard refuses every other origin
        app.add_middleware(CORSMiddleware, allow_origins=["*"] if "*" in origins else list(origins),
                           allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(BrowserGuardMiddleware, bound_host=args.host, allowed_hosts=args.allowed_hosts,
                       allowed_origins=args.allowed_origins)
    app.add_middleware(BodyDrainMiddleware)
