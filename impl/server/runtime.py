"""What every server process shares: logging, the engine build, the uvicorn config and graceful serving.

Used by ``impl/launch_server.py`` (one server, or the ``--dp-size`` front) and by
each data-parallel replica (``impl/server/dp_replica.py``), so neither imports
the other. Importing it loads torch (the ``impl`` package decides compiled or
interpreted Triton first, which imports torch), so a replica's OpenMP team size
comes from the environment it is spawned with (``ReplicaSpec.environment()``),
not from anything done here; the engine and the app are imported inside the
functions that build them.

* ``setup_logging``: one stderr handler with timestamps; uvicorn's loggers go through it.
* ``build_engine``: the ``Engine`` of ``ServerArgs`` (the embedded tiny model without
  ``--model-path``), with the main thread held to one torch thread, warmed up (``impl/engine/warmup.py``)
  unless ``--skip-server-warmup``.
* ``uvicorn_config``: the one ``uvicorn.Config`` (a TCP port, or a replica's Unix socket).
* ``serve``: runs a server and logs the ready line with its URL.
* ``GracefulServer``: on SIGTERM / Ctrl-C, in-flight requests get ``SHUTDOWN_GRACE_S``
  to finish, then they are aborted (their streams end with ``finish_reason: abort``);
  the process exits 0. ``CleanExitServer`` is its base (the data-parallel front's too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from typing import Any

import uvicorn

logger = logging.getLogger("impl")

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
READY = "The server is fired up and ready to roll!"
SHUTDOWN_GRACE_S = 5.0
# loggers of libraries that log one INFO line per request (the data-parallel front's relay client)
QUIET_LOGGERS = ("httpx",)


def setup_logging(level: str, prefix: str = "") -> None:
    """Timestamps for humans; uvicorn's loggers share the format (they propagate to root).
    ``prefix`` starts every message (a data-parallel replica's ``[DP<rank>] ``)."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = LOG_FORMAT.replace("%(message)s", prefix + "%(message)s")
    handler.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def build_engine(server_args):
    """The server's engine. From here on the calling (main) thread runs torch on one thread and the
    engine's scheduler thread gets the calling thread's count: one OpenMP team per process (see
    ``Engine.start_background_loop``)."""
    import torch

    from impl.engine.engine import Engine

    kwargs = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args) if f.name != "model_path"}
    path = server_args.model_path
    if path is None:
        from impl.models_builtin import DEFAULT_MODEL, default_model_path

        path = default_model_path()
        logger.info("No --model-path given: serving the embedded tiny Gemma-4 %r at %s", DEFAULT_MODEL, path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # before the model loads: the main thread never gets an OpenMP team
    engine = Engine(path, **kwargs)
    engine.scheduler_torch_threads = threads
    if not server_args.skip_server_warmup:
        from impl.engine.warmup import warm_up

        line = warm_up(engine)
        engine.startup_log.append(line)
        logger.info("%s", line)
    return engine


def uvicorn_config(app: Any, args: Any, uds: str | None = None) -> uvicorn.Config:
    """The server's uvicorn config from ``ServerArgs``: ``--host`` / ``--port``, or the Unix socket ``uds``."""
    where: dict[str, Any] = {"uds": uds} if uds is not None else {"host": args.host, "port": args.port}
    return uvicorn.Config(app, **where, log_config=None, log_level=args.log_level, access_log=bool(args.log_requests),
                          timeout_keep_alive=args.timeout_keep_alive, timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S) + 5)  # whole seconds (uvicorn)


async def serve(server: uvicorn.Server) -> None:
    """Run ``server``; once it listens on a TCP port, log the ready line with the URL."""
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started and server.config.uds is None:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        logger.info("%s URL: http://%s:%d", READY, host, port)
    await task


class CleanExitServer(uvicorn.Server):
    """A uvicorn server whose process exits 0 after a graceful shutdown (uvicorn would re-raise the signal)."""

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


class GracefulServer(CleanExitServer):
    """On SIGTERM / Ctrl-C, in-flight requests get SHUTDOWN_GRACE_S to finish, then they are aborted."""

    def __init__(self, config: uvicorn.Config, aengine):
        super().__init__(config)
        self.aengine = aengine

    async def shutdown(self, sockets=None) -> None:
        busy = self.aengine.load().num_reqs
        if busy:
            logger.info("Shutting down: %d request(s) in flight get %.0fs to finish, then are aborted", busy,
                        SHUTDOWN_GRACE_S)

        async def abort_late() -> None:
            await asyncio.sleep(SHUTDOWN_GRACE_S)
            self.aengine.abort(None)

        aborter = asyncio.create_task(abort_late())
        try:
            await super().shutdown(sockets)
        finally:
            aborter.cancel()


def serve_engine(engine, uds: str | None = None) -> None:
    """Serve the normal app over ``engine`` until SIGTERM / Ctrl-C (on ``uds`` for a replica)."""
    from impl.server.app import create_app

    app = create_app(engine)
    config = uvicorn_config(app, engine.resolved_args, uds)
    asyncio.run(serve(GracefulServer(config, app.state.server.aengine)))

