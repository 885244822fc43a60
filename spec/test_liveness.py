"""A subject that dies under a contract (``contracts.liveness``, ``bench/conformance_vllm.py``'s ``Supervisor``):
the contract whose request killed the server fails with the crash as evidence, never a harness error; a later
contract waits for the launcher's restart and runs, or is inconclusive when nothing restarts the server. No engine:
a fake server (standard library, a subprocess) that exits on ``POST /crash`` and answers 503 on ``/health`` after
``POST /break`` (an API server whose engine died)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from bench.conformance_vllm import Supervisor
from contracts import liveness
from contracts.adapters.http_adapter import HttpSubject
from contracts.base import Contract, ContractViolation, Inconclusive, require
from contracts.liveness import watch_servers

FAKE = textwrap.dedent("""
    import os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    broken = False

    class H(BaseHTTPRequestHandler):
        def _answer(self, code, body=b"{}"):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self._answer(503 if broken else 200)
            self._answer(404)

        def do_POST(self):
            global broken
            if self.path == "/crash":
                os._exit(3)  # the request kills the server before it answers
            if self.path == "/break":
                broken = True
            self._answer(200)

        def log_message(self, *a):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """bench.bench_peer.Server's shape: name, url, proc, log_path, start, stop."""

    def __init__(self, log_dir: str):
        self.name, self.port, self.proc = "fake", _port(), None
        self.log_path = os.path.join(log_dir, "fake.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", FAKE, str(self.port)], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while liveness.probe(self.url, timeout=2) is not None:
            assert time.monotonic() < deadline, "the fake server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setattr(liveness, "PROBE_GAP", 0.05)
    monkeypatch.setattr(liveness, "POLL", 0.05)
    monkeypatch.setattr(liveness, "_killed_by", {})
    srv = FakeServer(str(tmp_path))
    srv.start()
    yield srv
    srv.stop()


def _contract(cid: str, check) -> Contract:
    return Contract(cid, "a rule", "here", ("H4",), frozenset({"http"}), check)


def _post(http_subject: HttpSubject, path: str) -> None:
    httpx.post(http_subject.url + path, timeout=5).raise_for_status()


def _run(contract: Contract, subject) -> None:
    with watch_servers(contract, subject):  # as spec/test_contracts.py runs every contract
        contract.run(subject)


KILLER = _contract("TEST-KILLER", lambda s: _post(s, "/crash"))
NEXT = _contract("TEST-NEXT", lambda s: _post(s, "/ok"))


def test_the_contract_that_kills_the_server_fails_with_the_crash(fake):
    with pytest.raises(ContractViolation, match=r"the server crashed: http://127\.0\.0\.1:\d+ stopped answering "
                                                r"during this contract \(GET /health: ConnectError") as e:
        _run(KILLER, HttpSubject(fake.url))
    assert e.value.project  # a crash is this project's rule (a valid request must not take the server down)
    assert "stopped answering (crashed or closed the connection)" in str(e.value)  # its own result, kept


def test_a_crash_after_passing_checks_still_fails_and_keeps_a_seed_failure(fake):
    def passes_then_kills(subject) -> None:
        _post(subject, "/ok")
        try:
            _post(subject, "/crash")
        except httpx.HTTPError:
            pass  # a contract that swallows the error: the probe after it still sees the death

    with pytest.raises(ContractViolation, match="the contract's own checks had passed"):
        _run(_contract("TEST-QUIET-KILLER", passes_then_kills), HttpSubject(fake.url))

    fake.start()

    def seed_failure_then_break(subject) -> None:
        _post(subject, "/break")  # /health answers 503 from now on: the engine died, the API server did not exit
        require(False, "the seed's rule was broken")

    with pytest.raises(ContractViolation, match=r"GET /health answered 503.*the seed's rule was broken") as e:
        _run(_contract("TEST-SEED", seed_failure_then_break), HttpSubject(fake.url))
    assert not e.value.project  # the crash does not turn a seed-rule failure into a project-rule one


def test_without_a_restart_the_next_contract_is_inconclusive_naming_the_killer(fake):
    subject = HttpSubject(fake.url)
    with pytest.raises(ContractViolation):
        _run(KILLER, subject)
    with pytest.raises(Inconclusive, match=r"was down before this contract started since it stopped answering "
                                           r"during TEST-KILLER \(no launcher restarts it\)"):
        _run(NEXT, subject)


def test_the_supervisor_restarts_the_server_and_the_next_contract_runs(fake):
    subject = HttpSubject(fake.url, restart_wait=30)
    logs: list[str] = []
    with Supervisor([fake], lambda srv: srv.start(), interval=0.05, min_down=3, dead_after=0.3,
                    log=logs.append) as sup:
        with pytest.raises(ContractViolation, match="the server crashed"):
            _run(KILLER, subject)
        _run(NEXT, subject)  # waits for the restart, then passes
        with pytest.raises(ContractViolation, match="GET /health answered 503"):
            _run(_contract("TEST-BREAKER", lambda s: _post(s, "/break")), subject)
        _run(NEXT, subject)  # /health failing while the process runs: stopped and restarted after dead_after
    assert [r.why.split(" ")[0:3] for r in sup.restarts] == [["its", "process", "exited"], ["GET", "/health", "answered"]]
    assert all(not r.error for r in sup.restarts)
    assert os.path.exists(sup.restarts[0].log if os.path.isabs(sup.restarts[0].log) else
                          os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sup.restarts[0].log))
    assert any("is dead" in line for line in logs)


def test_subjects_without_servers_and_contracts_without_http_are_not_watched(fake):
    args_only = Contract("TEST-ARGS", "a rule", "here", ("F1",), frozenset({"args"}), lambda s: _post(s, "/crash"))
    with pytest.raises(ContractViolation) as e:  # an args contract is not judged by the servers' liveness
        _run(args_only, HttpSubject(fake.url))
    assert "the server crashed" not in str(e.value)

    class InProcess:
        name = "in process"

    _run(_contract("TEST-NO-SERVERS", lambda s: None), InProcess())
