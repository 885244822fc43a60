"""``--dp-size N``, the process side: start, watch, pick and stop the replica processes.

``DataParallelController`` spawns one process per rank (``impl.server.dp_replica``):
each has its own engine, KV pool and scheduler, pinned to its share of the CPU
cores (``core_shares``), on CUDA one GPU each, and serves the normal app on a
Unix socket in a private (0700) folder. A replica is started with its
``OMP_NUM_THREADS`` (and ``CUDA_VISIBLE_DEVICES``) already in its environment:
the spawned interpreter imports torch before ``run_replica`` runs. ``start``
returns once every rank answers ``/health`` (``YOCO_DP_READY_TIMEOUT`` seconds
at most); ``pick`` chooses the rank of a request by ``--load-balance-method``;
``stop`` SIGTERMs every rank (each drains its requests) and kills what is left
after ``STOP_TIMEOUT_S``. The HTTP front over the replicas is ``impl.server.dp_relay``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import httpx

from impl.envs import envs
from impl.server.dp_replica import ReplicaSpec, run_replica
from impl.server.errors import APIError

logger = logging.getLogger("impl.server.dp")

STOP_TIMEOUT_S = 15.0


@dataclass
class Replica:
    rank: int
    spec: ReplicaSpec
    proc: Any  # multiprocessing.Process
    client: httpx.AsyncClient | None = None  # the relay's connection pool to this rank's socket
    in_flight: int = 0
    served: int = 0

    @property
    def http(self) -> httpx.AsyncClient:
        """``client``, which the relay opens at the front's startup, before it serves a request."""
        assert self.client is not None, f"rank {self.rank}: the relay has not opened its client"
        return self.client

    def alive(self) -> bool:
        return self.proc.is_alive()

    def describe_exit(self) -> str:
        return f"data-parallel rank {self.rank} (pid {self.proc.pid}) exited with code {self.proc.exitcode}"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block (a process started there inherits them), then as before."""
    before = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@dataclass
class DataParallelController:
    """Starts, dispatches to and stops the replicas."""

    server_args: Any  # ServerArgs
    replicas: list[Replica] = field(default_factory=list)
    _next: int = 0
    _dir: str = ""

    @property
    def dp_size(self) -> int:
        return self.server_args.dp_size

    def start(self) -> None:
        """Spawn every rank and wait until each answers /health (a rank that exits first: RuntimeError)."""
        n = self.dp_size
        timeout = envs.YOCO_DP_READY_TIMEOUT.get()  # a junk value fails before any replica starts
        self._dir = tempfile.mkdtemp(prefix="yoco-dp-")
        os.chmod(self._dir, 0o700)
        shares = core_shares(n)
        cuda = _cuda_devices(self.server_args, n)
        ctx = multiprocessing.get_context("spawn")
        base = {**asdict(self.server_args)}
        for rank in range(n):
            spec = ReplicaSpec(rank, os.path.join(self._dir, f"dp{rank}.sock"), shares[rank], base, os.getpid(),
                               cuda[rank] if cuda else None)
            proc = ctx.Process(target=run_replica, args=(spec,), name=f"yoco-dp{rank}", daemon=False)
            with _environment(spec.environment()):  # the child inherits them, we keep ours
                proc.start()
            self.replicas.append(Replica(rank, spec, proc))
            logger.info("Data-parallel rank %d: pid %d, CPU cores %s (%d thread%s)%s", rank, proc.pid,
                        list(spec.cores), len(spec.cores), "" if len(spec.cores) == 1 else "s",
                        "" if spec.cuda_device is None else f", CUDA device {spec.cuda_device}")
        try:
            for r in self.replicas:
                _wait_ready(r, timeout)
                logger.info("Data-parallel rank %d ready (%s)", r.rank, r.spec.uds)
        except BaseException:
            self.stop()
            raise
        logger.info("%d data-parallel replicas ready; dispatch: %s", n, self.server_args.load_balance_method)

    def pick(self, rank: int | None = None) -> Replica:
        """The rank ``rank`` (503 when it has exited), else the next live rank by the load-balance method."""
        live = [r for r in self.replicas if r.alive()]
        if rank is not None:
            r = self.replicas[rank]
            if not r.alive():
                raise APIError(503, f"{r.describe_exit()}; data_parallel_rank {rank} cannot serve requests")
            return r
        if not live:
            raise APIError(503, "every data-parallel replica has exited; see the server log and restart the server")
        if self.server_args.load_balance_method == "shortest_queue":
            return min(live, key=lambda r: (r.in_flight, (r.rank - self._next) % self.dp_size))
        for _ in range(self.dp_size):
            r = self.replicas[self._next % self.dp_size]
            self._next += 1
            if r.alive():
                return r
        return live[0]

    def first_live(self) -> int | None:
        return next((r.rank for r in self.replicas if r.alive()), None)

    def signal_all(self) -> None:
        """SIGTERM every live replica: each drains its requests (SHUTDOWN_GRACE_S), then exits."""
        for r in self.replicas:
            if r.alive():
                r.proc.terminate()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        self.signal_all()
        deadline = time.monotonic() + timeout
        for r in self.replicas:
            r.proc.join(max(0.0, deadline - time.monotonic()))
            if r.proc.is_alive():
                logger.warning("data-parallel rank %d did not exit within %.0fs; killing it", r.rank, timeout)
                r.proc.kill()
                r.proc.join(5)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def core_shares(n: int) -> list[tuple[int, ...]]:
    """Split the cores this process may use into ``n`` contiguous shares (ranks share cores when n > cores)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if n >= len(cores):
        return [(cores[i % len(cores)],) for i in range(n)]
    k, extra = divmod(len(cores), n)
    out, start = [], 0
    for i in range(n):
        size = k + (1 if i < extra else 0)
        out.append(tuple(cores[start:start + size]))
        start += size
    return out


def _cuda_devices(args: Any, n: int) -> list[int] | None:
    """One GPU per rank on CUDA (ValueError when there are fewer); None on CPU."""
    from impl.args.attention import device_of

    if device_of(args) != "cuda":
        return None
    import torch

    count = torch.cuda.device_count()
    if count < n:
        raise ValueError(f"--dp-size {n} on CUDA needs one GPU per replica; torch sees {count}. "
                         f"Use --dp-size {max(1, count)} or --device cpu")
    return list(range(n))


def validate_dp_args(args: Any) -> None:
    if not isinstance(args.dp_size, int) or args.dp_size < 1:
        raise ValueError(f"--dp-size must be a positive number of replicas, got {args.dp_size}")


def _wait_ready(r: Replica, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(transport=httpx.HTTPTransport(uds=r.spec.uds), base_url="http://localhost", timeout=5.0) as c:
        while time.monotonic() < deadline:
            if not r.alive():
                raise RuntimeError(f"{r.describe_exit()} before it was ready; see its [DP{r.rank}] log lines above")
            if os.path.exists(r.spec.uds):
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("/health").status_code == 200:
                        return
            time.sleep(0.1)
    raise RuntimeError(f"data-parallel rank {r.rank} not ready within {timeout:.0f}s")
