"""A server that dies under a contract: a failure of the engine (a crash, with the evidence), never a harness error.

An ``http`` subject talks to servers someone else launched (``contracts.adapters.http_adapter.HttpSubject``), so a
request that kills one would otherwise leave every later contract talking to a dead port. ``watch_servers(contract,
subject)`` runs around each contract that needs the servers (``http`` or ``bench``):

* before it, every server must answer ``GET /health``. A launcher that restarts dead servers
  (``bench/conformance_vllm.py``'s ``Supervisor``) tells the subject how long a restart may take
  (``--subject-restart-wait``); the contract waits that long for a dead server to come back. A server still down
  makes the contract inconclusive (its rule was never tried: not a verdict, not a harness error), naming the
  contract under which the server died;
* after it, a server that answered before and no longer does (its connection refused or reset, a 5xx from
  ``/health``: vLLM answers 503 once its engine core died) crashed under this contract: the contract fails with
  that evidence, whatever its own outcome was (a passing run, a violation, a harness error from the dead
  connection), and the server is remembered as killed by it.

A ``/health`` the server does not route (404) still shows it answering. Subjects without servers
(``watched_servers`` absent or empty: impl, sglang, vllm in process) run unwatched.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from contracts.base import Contract, ContractViolation, Inconclusive

SERVER_CAPABILITIES = frozenset({"http", "bench"})
PROBE_TIMEOUT = 30.0  # s: after a contract nothing runs, so a live server answers /health well within this
PROBE_TRIES = 3  # a server is dead when this many probes, PROBE_GAP s apart, all fail
PROBE_GAP = 1.0
POLL = 2.0  # s between probes while waiting for a restart

_killed_by: dict[str, str] = {}  # url -> the contract under which that server stopped answering


def probe(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when the server at ``url`` answers ``GET /health`` (any answer below 500), else what went wrong."""
    import httpx

    try:
        r = httpx.get(f"{url}/health", timeout=timeout)
    except httpx.HTTPError as e:
        return f"GET /health: {type(e).__name__}: {e}"
    if r.status_code >= 500:
        return f"GET /health answered {r.status_code}: {r.text[:200]!r}"
    return None


def dead(url: str, tries: int = PROBE_TRIES, gap: float = PROBE_GAP) -> str | None:
    """None when the server answers within ``tries`` probes; else the last probe's failure."""
    why = None
    for i in range(tries):
        why = probe(url)
        if why is None:
            return None
        if i + 1 < tries:
            time.sleep(gap)
    return why


def wait_up(url: str, wait: float) -> str | None:
    """Wait up to ``wait`` s for the server to answer; None once it does, else the last probe's failure."""
    deadline = time.monotonic() + wait
    while True:
        why = probe(url)
        if why is None:
            return None
        if time.monotonic() >= deadline:
            return why
        time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))


def _watched(contract: Contract, subject: Any) -> list[str]:
    if not contract.needs & SERVER_CAPABILITIES:
        return []
    servers = getattr(subject, "watched_servers", None)
    return list(servers()) if callable(servers) else []


def crash_violation(contract: Contract, crashed: dict[str, str], outcome: BaseException | None) -> ContractViolation:
    """The contract's failure for the servers that stopped answering under it, with its own result as context."""
    where = "; ".join(f"{url} stopped answering during this contract ({why})" for url, why in crashed.items())
    if outcome is None:
        own = "the contract's own checks had passed"
    else:
        text = str(outcome).removeprefix(f"[{contract.id}] ")
        own = f"the contract's own result: {type(outcome).__name__}: {text}"
    # A crash fails the contract on this project's rule (a valid request must not take the server down) unless its
    # own checks already failed a seed rule (not merely met the dead connection), which the crash does not excuse.
    import httpx

    own_seed_failure = (isinstance(outcome, ContractViolation) and not outcome.project
                        and not isinstance(outcome.__cause__, httpx.TransportError))
    project = not own_seed_failure
    return ContractViolation(contract.id, f"the server crashed: {where}; {own}", project=project)


@contextlib.contextmanager
def watch_servers(contract: Contract, subject: Any) -> Iterator[None]:
    urls = _watched(contract, subject)
    if not urls:
        yield
        return
    wait = float(getattr(subject, "restart_wait", 0.0) or 0.0)
    for url in urls:
        why = wait_up(url, wait)
        if why is not None:
            killer = _killed_by.get(url)
            since = f" since it stopped answering during {killer}" if killer else ""
            waited = f" and did not come back within {wait:.0f} s" if wait else " (no launcher restarts it)"
            raise Inconclusive(f"[{contract.id}] the server {url} was down before this contract started{since}"
                               f"{waited}: {why}; the rule was not tried")
    try:
        yield
    except Exception as e:
        crashed = _crashed(urls, contract)
        if crashed:
            raise crash_violation(contract, crashed, e) from e
        raise
    crashed = _crashed(urls, contract)
    if crashed:
        raise crash_violation(contract, crashed, None)


def _crashed(urls: list[str], contract: Contract) -> dict[str, str]:
    out = {}
    for url in urls:
        why = dead(url)
        if why is not None:
            out[url] = why
            _killed_by[url] = contract.id
    return out
