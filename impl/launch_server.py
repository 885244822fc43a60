"""``python -m impl.launch_server [ServerArgs flags]`` (console script ``yoco-launch-server``).

Without ``--model-path`` the embedded tiny Gemma-4 (``impl.models_builtin``,
built and cached on first use) is served, so a fresh clone serves at once.
Startup log (logger ``impl``): version, the default-model choice, every
declared resolution with its source and the fast-prefill line
(``check_server_args``), device and attention backends (the engine adds the
line saying Triton runs interpreted), KV pool size, the resolved arguments, and finally
the ready line with the URL. SIGTERM / Ctrl-C: in-flight requests get
``SHUTDOWN_GRACE_S`` to finish, then they are aborted (their streams end with
``finish_reason: abort``) and the process exits. What a server process shares
with a data-parallel replica (logging, the engine build, the uvicorn config,
graceful serving) is ``impl/server/runtime.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from typing import Sequence

import impl
from impl.args.server_args import ServerArgs, make_parser
from impl.server.limits import RequestLimits
from impl.server.runtime import build_engine, serve_engine, setup_logging

logger = logging.getLogger("impl")


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


def main(argv: Sequence[str] | None = None) -> int:
    ns = make_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    server_args = ServerArgs.from_cli_args(ns)
    setup_logging(server_args.log_level)
    logger.info("yoco-gemma4 %s: launching the HTTP server", impl.__version__)
    if server_args.dp_size != 1:
        return _main_data_parallel(server_args)
    try:
        RequestLimits.from_args(server_args)  # a bad limit flag fails before the model loads
        engine = build_engine(server_args)
    except (ValueError, RuntimeError) as e:
        logger.error("%s", e)
        return 2
    log_platform(engine)
    logger.info("Resolved server args: %s", describe_args(engine.resolved_args))
    serve_engine(engine)
    return 0


def _main_data_parallel(server_args: ServerArgs) -> int:
    """--dp-size N: N replica processes (impl.server.dp_control) behind one HTTP front (impl.server.dp_relay)."""
    from impl.server.dp_control import DataParallelController, validate_dp_args
    from impl.server.dp_relay import DrainingFront, create_dp_app
    from impl.server.runtime import serve, uvicorn_config

    try:
        RequestLimits.from_args(server_args)  # a bad limit flag fails before any replica starts
        validate_dp_args(server_args)
        ctrl = DataParallelController(server_args)
        ctrl.start()
    except (ValueError, RuntimeError) as e:
        logger.error("%s", e)
        return 2
    try:
        asyncio.run(serve(DrainingFront(uvicorn_config(create_dp_app(ctrl), server_args), ctrl)))
    finally:
        ctrl.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
