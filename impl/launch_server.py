"""``python -m impl.launch_server [ServerArgs flags]`` (console script ``yoco-launch-server``).

Without ``--model-path`` the embedded tiny Gemma-4 (``impl.testing.checkpoints``,
built and cached on first use) is served, so a fresh clone serves at once.
Startup log (logger ``impl``): version, the default-model choice, every
declared resolution with its source and the fast-prefill line
(``check_server_args``), device and attention backends (the engine adds the
line saying Triton runs interpreted), KV pool size, the resolved arguments, and finally
the ready line with the URL. SIGTERM / Ctrl-C: in-flight requests get
``SHUTDOWN_GRACE_S`` to finish, then they are aborted (their streams end with
``finish_reason: abort``) and the process exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from typing import Sequence

import uvicorn

import impl
from impl.args.server_args import ServerArgs, make_parser

logger = logging.getLogger("impl")

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
READY = "The server is fired up and ready to roll!"
SHUTDOWN_GRACE_S = 5.0


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


def describe_args(args: ServerArgs) -> str:
    """Resolved arguments that differ from the defaults (plus the fast-prefill flag), api_key hidden."""
    defaults = ServerArgs()
    parts = []
    for f in dataclasses.fields(args):
        v = getattr(args, f.name)
        if f.name == "kv_sharing_fast_prefill" or v != getattr(defaults, f.name):
            parts.append(f"{f.name}={'<redacted>' if f.name == 'api_key' and v else v!r}")
    return ", ".join(parts)


def log_platform(engine) -> None:
    """The device choice and why (the engine logs the backends and the interpreted-Triton line)."""
    args = engine.resolved_args
    device = engine.device.type
    why = "given by --device" if args.device != "auto" else (
        "--device auto: CUDA is available" if device == "cuda" else "--device auto: torch sees no CUDA device")
    logger.info("Device: %s (%s)", device, why)


def build_engine(server_args: ServerArgs):
    """The server's engine. From here on the calling (main) thread runs torch on one thread and the
    engine's scheduler thread gets the calling thread's count: one OpenMP team per process (see
    ``Engine.start_background_loop``)."""
    import torch

    from impl.engine.engine import Engine

    kwargs = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args) if f.name != "model_path"}
    path = server_args.model_path
    if path is None:
        from impl.testing.checkpoints import DEFAULT_MODEL, default_model_path

        path = default_model_path()
        logger.info("No --model-path given: serving the embedded tiny Gemma-4 %r at %s", DEFAULT_MODEL, path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # before the model loads: the main thread never gets an OpenMP team
    engine = Engine(path, **kwargs)
    engine.scheduler_torch_threads = threads
    return engine


def main(argv: Sequence[str] | None = None) -> int:
    ns = make_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    server_args = ServerArgs.from_cli_args(ns)
    setup_logging(server_args.log_level)
    logger.info("yoco-gemma4 %s: launching the HTTP server", impl.__version__)
    if server_args.dp_size != 1:
        return _main_data_parallel(server_args)
    try:
        from impl.server.limits import RequestLimits

        RequestLimits.from_args(server_args)  # a bad limit flag fails before the model loads
        engine = build_engine(server_args)
    except (ValueError, RuntimeError) as e:
        logger.error("%s", e)
        return 2
    log_platform(engine)
    logger.info("Resolved server args: %s", describe_args(engine.resolved_args))
    from impl.server.app import create_app

    app = create_app(engine)
    asyncio.run(serve(app, engine.resolved_args))
    return 0


def _main_data_parallel(server_args: ServerArgs) -> int:
    """--dp-size N: N replica processes behind one HTTP front (impl.server.dp_front)."""
    from impl.server.dp_front import DataParallelController, DrainingFront, create_dp_app, validate_dp_args

    try:
        from impl.server.limits import RequestLimits

        RequestLimits.from_args(server_args)  # a bad limit flag fails before any replica starts
        validate_dp_args(server_args)
        ctrl = DataParallelController(server_args)
        ctrl.start()
    except (ValueError, RuntimeError) as e:
        logger.error("%s", e)
        return 2
    try:
        asyncio.run(serve(create_dp_app(ctrl), server_args, lambda config: DrainingFront(config, ctrl)))
    finally:
        ctrl.stop()
    return 0


async def serve(app, args, make_server=None) -> None:
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, log_level=args.log_level,
                            access_log=bool(args.log_requests), timeout_graceful_shutdown=SHUTDOWN_GRACE_S + 5,
                            timeout_keep_alive=args.timeout_keep_alive)
    server = make_server(config) if make_server is not None else GracefulServer(config, app.state.server.aengine)
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        logger.info("%s URL: http://%s:%d", READY, host, port)
    await task


class GracefulServer(uvicorn.Server):
    """On SIGTERM / Ctrl-C, in-flight requests get SHUTDOWN_GRACE_S to finish, then they are aborted."""

    def __init__(self, config: uvicorn.Config, aengine):
        super().__init__(config)
        self.aengine = aengine

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # exit 0 after a graceful shutdown (uvicorn would re-raise the signal)

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


if __name__ == "__main__":
    raise SystemExit(main())
