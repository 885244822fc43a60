"""One data-parallel replica (``--dp-size N``): a full engine and HTTP app on a private Unix socket.

``run_replica`` is the target of a spawned process (``impl.server.dp_control``
starts one per rank, with ``ReplicaSpec.environment()`` in its environment: the
spawned interpreter loads torch, and so OpenMP and CUDA, before this function
runs). It pins itself to its share of the CPU cores (``os.sched_setaffinity``
and ``torch.set_num_threads``), builds its own Engine (own KV pool, own
scheduler thread) and serves the normal app on ``uds`` (``impl.server.runtime``).
Its log lines carry ``[DP<rank>]``. It exits when its parent (the front) is
gone, so a killed front leaves no orphans.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from impl.server.runtime import build_engine, serve_engine, setup_logging

PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class ReplicaSpec:
    rank: int
    uds: str
    cores: tuple[int, ...]
    server_args: dict[str, Any]  # ServerArgs fields (dp_size 1, no api key: the front checks it)
    parent_pid: int
    cuda_device: int | None = None

    def environment(self) -> dict[str, str]:
        """Variables the process must start with: its OpenMP team size and, on CUDA, its one GPU."""
        env = {"OMP_NUM_THREADS": str(max(1, len(self.cores)))}
        if self.cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.cuda_device)
        return env


def run_replica(spec: ReplicaSpec) -> None:
    os.environ.update(spec.environment())  # for anything this process starts
    if spec.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec.cores)
    args = _server_args(spec)
    setup_logging(args.log_level, prefix=f"[DP{spec.rank}] ")
    _exit_with_parent(spec.parent_pid)

    import torch

    torch.set_num_threads(max(1, len(spec.cores)))  # the count build_engine hands to the scheduler thread
    serve_engine(build_engine(args), uds=spec.uds)


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
