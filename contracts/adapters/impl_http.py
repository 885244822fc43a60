"""Real ``impl`` servers for the ``http`` capability: one subprocess per distinct argv.

``base_url(argv)`` starts ``python -m impl.launch_server *argv --host 127.0.0.1
--port 0`` (the OS picks a free port; the ready line names it), waits for the
ready line and ``/health``, and caches the server for the rest of the session;
every server is stopped (SIGTERM, then SIGKILL) at interpreter exit.
``startup_log(argv)`` is that server's log up to and including the ready line.

A mutant server (``contracts/mutants/http_mutants.py``) is the same launch
through ``python -m contracts.mutants.http_mutants NAME *argv``, which patches
the implementation in its own process before starting it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import httpx

READY_RE = re.compile(r"ready to roll!.*?(http://[\d.]+:\d+)")
START_TIMEOUT_S = float(os.environ.get("YOCO_SERVER_START_TIMEOUT", "300"))
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class RunningServer:
    argv: tuple[str, ...]
    mutant: str | None
    proc: subprocess.Popen
    log_path: str
    url: str = ""

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout``), then delete the log file."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)
        return self.proc.returncode


_SERVERS: dict[tuple[tuple[str, ...], str | None], RunningServer] = {}
_LOCK = threading.Lock()


def command(argv: Sequence[str], mutant: str | None = None) -> list[str]:
    entry = ["-m", "impl.launch_server"] if mutant is None else ["-m", "contracts.mutants.http_mutants", mutant]
    return [sys.executable, *entry, *argv, "--host", "127.0.0.1", "--port", "0"]


def start(argv: Sequence[str], mutant: str | None = None, env: dict[str, str] | None = None) -> RunningServer:
    """Start a fresh (uncached) server and wait until it is ready; the caller stops it."""
    fd, log_path = tempfile.mkstemp(prefix="yoco-server-", suffix=".log")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, full_env.get("PYTHONPATH")) if p)
    with os.fdopen(fd, "w") as log:
        proc = subprocess.Popen(command(argv, mutant), stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env=full_env, start_new_session=True)
    server = RunningServer(tuple(argv), mutant, proc, log_path)
    try:
        server.url = _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: RunningServer) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = READY_RE.search(server.log())
        if m:
            url = m.group(1)
            if httpx.get(url + "/health", timeout=10).status_code == 200:
                return url
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"server {' '.join(command(server.argv, server.mutant))} exited with {server.proc.returncode} "
                f"before it was ready; its log ends:\n{server.log()[-3000:]}"
            )
        time.sleep(0.1)
    raise RuntimeError(f"server {server.argv} not ready within {START_TIMEOUT_S:.0f}s; log:\n{server.log()[-3000:]}")


def server(argv: Sequence[str], mutant: str | None = None) -> RunningServer:
    """The cached server for ``argv`` (started on first use, restarted if it died)."""
    key = (tuple(argv), mutant)
    with _LOCK:
        s = _SERVERS.get(key)
        if s is None or s.proc.poll() is not None:
            if mutant is not None:  # one mutant server at a time: mutants are tried one after another
                for k in [k for k in _SERVERS if k[1] is not None]:
                    _SERVERS.pop(k).stop()
            s = _SERVERS[key] = start(argv, mutant)
        return s


def base_url(argv: Sequence[str], mutant: str | None = None) -> str:
    return server(argv, mutant).url


def startup_log(argv: Sequence[str], mutant: str | None = None) -> str:
    log = server(argv, mutant).log()
    m = READY_RE.search(log)
    if m is None:
        return log
    end = log.find("\n", m.end())
    return log if end < 0 else log[: end + 1]


def stop_all() -> None:
    for s in list(_SERVERS.values()):
        s.stop()
    _SERVERS.clear()


atexit.register(stop_all)
