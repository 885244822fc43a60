"""One data-parallel replica (``--dp-size N``): a full engine and HTTP app on a private Unix socket.

``run_replica`` is the target of a spawned process (``impl.server.dp_front``
starts one per rank). It pins itself to its share of the CPU cores
(``os.sched_setaffinity`` and ``torch.set_num_threads``), builds its own Engine
(own KV pool, own scheduler thread) and serves the normal app on ``uds``. Its
log lines carry ``[DP<rank>]``. It exits when its parent (the front) is gone,
so a killed front leaves no orphans. This module imports no torch at the top:
the process sets its thread count before torch is loaded.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class ReplicaSpec:
    rank: int
    uds: str
    cores: tuple[int, ...]
    server_args: dict[str, Any]  # ServerArgs fields (dp_size 1, no api key: the front checks it)
    parent_pid: int
    cuda_device: int | None = None


def run_replica(spec: ReplicaSpec) -> None:
    threads = max(1, len(spec.cores))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if spec.cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(spec.cuda_device)
    if spec.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec.cores)
    from impl.launch_server import SHUTDOWN_GRACE_S, GracefulServer, build_engine, setup_logging

    args = _server_args(spec)
    setup_logging(args.log_level, prefix=f"[DP{spec.rank}] ")
    _exit_with_parent(spec.parent_pid)

    import torch
    import uvicorn

    torch.set_num_threads(threads)  # the count build_engine hands to the scheduler thread
    engine = build_engine(args)
    from impl.server.app import create_app

    app = create_app(engine)
    config = uvicorn.Config(app, uds=spec.uds, log_config=None, log_level=args.log_level,
                            access_log=bool(args.log_requests), timeout_keep_alive=args.timeout_keep_alive,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S + 5)
    asyncio.run(GracefulServer(config, app.state.server.aengine).serve())


def _server_args(spec: ReplicaSpec):
    from impl.args.server_args import ServerArgs

    return ServerArgs(**{**spec.server_args, "dp_size": 1, "api_key": None})


def _exit_with_parent(parent_pid: int) -> None:
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(PARENT_POLL_S)

    threading.Thread(target=watch, name="dp-parent-watch", daemon=True).start()
