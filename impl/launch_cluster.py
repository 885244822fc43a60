"""``python -m impl.launch_cluster --num-workers K [--policy P] [-- launch_server flags]``: K workers behind
``sglang-router`` on loopback ports (``make serve-cluster``).

Each worker is ``python -m impl.launch_server <flags> --host 127.0.0.1 --port 0``
(the OS picks a free port; the worker's ready line names it). When every worker
is ready, ``python -m sglang_router.launch_router`` starts on ``--host``/``--port``
with their URLs and ``--policy`` (cache_aware, power_of_two, round_robin,
random). Every child's log lines are relayed with a ``[worker i]`` / ``[router]``
prefix, and the router URL is printed once the router answers. SIGTERM /
Ctrl-C: the router stops first (no new traffic), then the workers get SIGTERM
(each drains its in-flight requests) and the launcher exits 0.

``sglang-router`` is the optional extra ``cluster``: ``pip install '.[cluster]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Sequence

import httpx

from impl.envs import envs

logger = logging.getLogger("impl.cluster")

READY_RE = re.compile(r"ready to roll!.*?(http://[\d.]+:\d+)")
POLICIES = ("cache_aware", "power_of_two", "round_robin", "random")
START_TIMEOUT_S = envs.YOCO_SERVER_START_TIMEOUT.get()
STOP_TIMEOUT_S = 20.0
CLUSTER_READY = "The cluster is up: router URL"


def router_available() -> str | None:
    """None when ``sglang_router`` can be imported, else why not (with the fix)."""
    if importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed: pip install '.[cluster]' (or pip install sglang-router==0.3.2)"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    ready_url: str | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def pump(self, out: IO[str] | None) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                if self.ready_url is None:
                    m = READY_RE.search(line)
                    if m:
                        self.ready_url = m.group(1)
                self._cond.notify_all()
            if out is not None:
                out.write(f"[{self.name}] {line}")
                out.flush()

    def wait_ready(self, deadline: float) -> str:
        with self._cond:
            while self.ready_url is None:
                if self.proc.poll() is not None:
                    tail = "".join(self.lines[-30:])
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready:\n{tail}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name} not ready within {START_TIMEOUT_S:.0f}s")
                self._cond.wait(min(left, 0.5))
            return self.ready_url

    def log(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


def spawn(name: str, argv: list[str], out: IO[str] | None, cores: Sequence[int] | None = None) -> Child:
    """Start ``argv`` in its own session, its output relayed to ``out`` with a ``[name]`` prefix; ``cores``: pin it
    to those CPU cores (affinity and OMP_NUM_THREADS, so torch runs one thread per core it owns)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pin = None
    if cores:
        env["OMP_NUM_THREADS"] = str(len(cores))
        pin = lambda: os.sched_setaffinity(0, cores)  # noqa: E731 - runs in the child before exec
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, errors="replace", preexec_fn=pin)
    child = Child(name, argv, proc)
    threading.Thread(target=child.pump, args=(out,), name=f"pump-{name}", daemon=True).start()
    return child


def worker_argv(server_flags: Sequence[str], port: int = 0) -> list[str]:
    return [sys.executable, "-m", "impl.launch_server", *server_flags, "--host", "127.0.0.1", "--port", str(port)]


def router_argv(worker_urls: Sequence[str], host: str, port: int, policy: str, extra: Sequence[str] = ()) -> list[str]:
    """The router's command line; its Prometheus exporter gets a free loopback port unless ``extra`` names one
    (the router's default, 29000, would collide between two routers on one host)."""
    prom = [] if "--prometheus-port" in extra else ["--prometheus-host", "127.0.0.1", "--prometheus-port",
                                                     str(free_port())]
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--log-level", "warn", *prom, *extra]


def wait_router(url: str, router: Child, num_workers: int, deadline: float, api_key: str | None = None) -> None:
    """Until the router answers /v1/models and lists every worker healthy."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    while time.monotonic() < deadline:
        if router.proc.poll() is not None:
            raise RuntimeError(f"the router exited with {router.proc.returncode}:\n{router.log()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            workers = httpx.get(url + "/workers", timeout=5, headers=headers).json()
            healthy = [w for w in workers.get("workers", []) if w.get("is_healthy", True)]
            if len(healthy) >= num_workers and httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the router at {url} did not list {num_workers} healthy workers in time:\n{router.log()[-3000:]}")


def start_router(name: str, worker_urls: Sequence[str], host: str, policy: str, extra: Sequence[str],
                 out: IO[str] | None, deadline: float, num_workers: int, api_key: str | None = None,
                 port: int = 0, attempts: int = 3) -> tuple[Child, str]:
    """Spawn a router and wait until it lists every worker healthy; returns it and its URL.

    A port from ``free_port`` is only free when it is picked: until the router binds it, any process's
    outgoing connection may take it as its ephemeral local port. So a router that exits with "Address
    already in use" is started again on fresh ports (a ``port`` given by the caller is kept; only the
    Prometheus port changes then), up to ``attempts`` times."""
    for attempt in range(1, attempts + 1):
        p = port or free_port(host)
        child = spawn(name, router_argv(worker_urls, host, p, policy, extra), out)
        url = f"http://{host}:{p}"
        try:
            wait_router(url, child, num_workers, deadline, api_key)
            return child, url
        except RuntimeError as e:
            child.stop()
            if "Address already in use" not in str(e) or attempt == attempts:
                raise
            logger.warning("%s: a port was taken before the router bound it; starting it again (%s)", name, e)
    raise AssertionError("unreachable")


@dataclass
class Cluster:
    workers: list[Child]
    router: Child | None = None
    router_url: str = ""

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for w in self.workers:  # all drain at once
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGTERM)
        for w in self.workers:
            w.stop()


def start_cluster(num_workers: int, server_flags: Sequence[str], policy: str = "cache_aware",
                  host: str = "127.0.0.1", port: int = 0, router_flags: Sequence[str] = (),
                  out: IO[str] | None = sys.stderr, pin: bool = True) -> Cluster:
    """Start the workers (in parallel, each pinned to its share of the cores unless ``pin`` is False) and then
    the router; on any failure stop what started and raise."""
    why = router_available()
    if why:
        raise RuntimeError(why)
    if policy == "power_of_two" and num_workers < 2:
        raise ValueError("--policy power_of_two needs at least 2 workers (the router refuses it otherwise)")
    from impl.server.dp_control import core_shares

    shares = core_shares(num_workers) if pin else [None] * num_workers
    cluster = Cluster([spawn(f"worker {i}", worker_argv(server_flags), out, shares[i]) for i in range(num_workers)])
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        urls = [w.wait_ready(deadline) for w in cluster.workers]
        api_key = _flag_value(server_flags, "--api-key")
        extra = list(router_flags) + (["--api-key", api_key] if api_key and "--api-key" not in router_flags else [])
        cluster.router, cluster.router_url = start_router("router", urls, host, policy, extra, out, deadline,
                                                          num_workers, api_key, port)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _flag_value(flags: Sequence[str], name: str) -> str | None:
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return None


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="impl.launch_cluster",
        description="K impl.launch_server workers behind sglang-router, all on loopback. Flags after '--' go to "
                    "every worker (launch_server's flags).")
    p.add_argument("--num-workers", type=int, default=2, help="Number of worker servers (default 2).")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware", help="The router's load-balancing policy.")
    p.add_argument("--host", default="127.0.0.1", help="Router host (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=30000, help="Router port (default 30000; 0: a free port).")
    p.add_argument("--router-args", default="", help="Extra sglang_router.launch_router flags, one string.")
    p.add_argument("--no-pin", action="store_true",
                   help="Do not pin each worker to its share of the CPU cores (default: pinned, as --dp-size does).")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_flags: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, server_flags = argv[:k], argv[k + 1:]
    ns = make_parser().parse_args(argv)
    if ns.num_workers < 1:
        print(f"--num-workers must be at least 1, got {ns.num_workers}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster = start_cluster(ns.num_workers, server_flags, ns.policy, ns.host, ns.port, ns.router_args.split(),
                                pin=not ns.no_pin)
    except (RuntimeError, ValueError) as e:
        print(f"launch_cluster: {e}", file=sys.stderr)
        return 2
    workers = ", ".join(w.ready_url or "?" for w in cluster.workers)
    print(f"{CLUSTER_READY} {cluster.router_url} (policy {ns.policy}; workers {workers})", file=sys.stderr, flush=True)
    try:
        while not stop.is_set():
            if cluster.router is not None and cluster.router.proc.poll() is not None:
                print(f"launch_cluster: the router exited with {cluster.router.proc.returncode}", file=sys.stderr)
                break
            stop.wait(0.5)
    finally:
        print("launch_cluster: stopping the router, then draining the workers", file=sys.stderr, flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
