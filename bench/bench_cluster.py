"""Scale-out on one host (not a test): one server vs K workers behind sglang-router, and --dp-size 2 vs 1.

Systems, all up at once on loopback and measured side by side:
* ``1 server``: ``impl.launch_server`` (torch uses every core; this is also ``--dp-size 1``);
* ``1 server pinned to 1 core``: the same, one core and one thread (a per-core reference);
* ``router + K workers`` for each K in ``--workers``: ``impl.launch_cluster``'s pieces, each worker pinned to
  its share of the cores, router policy ``--policy``;
* ``--dp-size 2``: one front, two replicas pinned to a share of the cores each.

Workload: ``--num-requests`` requests of ``--prompt-len`` random token ids and exactly ``--output-len`` output
tokens (greedy, EOS ignored), all sent at t=0 through POST /generate (the router passes ``input_ids`` through).
Each round runs every system once, in a rotated order, after flushing its prefix cache; the table gives each
system's median output tok/s over ``--repeat`` rounds, tok/s per core and the ratio to the single server.
On a machine with C cores, K workers can at best use the same C cores as one server: the gain is bounded by
how badly one process uses them (Python overhead, one scheduler thread), not by K.

Usage: ``python -m bench.bench_cluster [--workers 2 4] [--repeat 3]`` (``make bench-cluster``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time


import httpx

from impl.launch_cluster import START_TIMEOUT_S, spawn, start_router, worker_argv
from impl.server.dp_control import core_shares

SERVER_FLAGS = ["--decode-attention-backend", "torch_native", "--context-length", "1024", "--max-total-tokens", "16384",
                "--random-seed", "0"]


class System:
    def __init__(self, name: str, url: str, children: list, processes: int):
        self.name, self.url, self.children, self.processes = name, url, children, processes
        self.tok_s: list[float] = []

    def stop(self) -> None:
        for c in self.children:
            c.stop()


def start_systems(args) -> list[System]:
    systems: list[System] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    single = spawn("single", worker_argv(SERVER_FLAGS), None)
    one_core = spawn("one core", worker_argv(SERVER_FLAGS), None, core_shares(1)[0][:1])
    dp = spawn("dp2", worker_argv([*SERVER_FLAGS, "--dp-size", "2"]), None) if not args.skip_dp else None
    clusters = []
    for k in args.workers:
        shares = core_shares(k)
        clusters.append((k, [spawn(f"w{k}.{i}", worker_argv(SERVER_FLAGS), None, shares[i]) for i in range(k)]))
    try:
        systems.append(System("1 server (= --dp-size 1)", single.wait_ready(deadline), [single], 1))
        systems.append(System("1 server pinned to 1 core (reference)", one_core.wait_ready(deadline), [one_core], 1))
        if dp is not None:
            systems.append(System("--dp-size 2", dp.wait_ready(deadline), [dp], 3))
        for k, workers in clusters:
            urls = [w.wait_ready(deadline) for w in workers]
            router, url = start_router(f"router{k}", urls, "127.0.0.1", args.policy, (), None, deadline, k)
            systems.append(System(f"router + {k} workers", url, [router, *workers], k + 1))
    except BaseException:
        for c in [single, one_core, dp, *(w for _, ws in clusters for w in ws)]:
            if c is not None:
                c.stop()
        for s in systems:
            s.stop()
        raise
    return systems


def workload(args) -> list[dict]:
    rng = random.Random(args.seed)
    sp = {"temperature": 0.0, "max_new_tokens": args.output_len, "ignore_eos": True}
    return [{"input_ids": [rng.randrange(16, 250) for _ in range(args.prompt_len)], "sampling_params": sp}
            for _ in range(args.num_requests)]


async def run_once(url: str, bodies: list[dict]) -> tuple[float, int]:
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), limits=limits) as c:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(c.post(url + "/generate", json=b) for b in bodies))
        wall = time.perf_counter() - t0
    for r in outs:
        r.raise_for_status()
    return wall, sum(r.json()["meta_info"]["completion_tokens"] for r in outs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--policy", default="round_robin", choices=("round_robin", "cache_aware", "power_of_two", "random"))
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=96)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-dp", action="store_true")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"# {args.num_requests} requests x ({args.prompt_len} prompt + {args.output_len} output tokens), all at "
          f"t=0; {cores} cores; tiny e2b (float32); {args.repeat} alternating rounds; router policy {args.policy}")
    systems = start_systems(args)
    try:
        bodies = workload(args)
        for s in systems:  # warm-up (first forwards, connection pools)
            asyncio.run(run_once(s.url, bodies[:2]))
        for rnd in range(args.repeat):
            order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
            for s in order:
                httpx.post(s.url + "/flush_cache", timeout=60)
                wall, tokens = asyncio.run(run_once(s.url, bodies))
                s.tok_s.append(tokens / wall)
                print(f"  round {rnd}: {s.name}: {tokens} tokens in {wall:.2f}s = {tokens / wall:.1f} tok/s", flush=True)
    finally:
        for s in systems:
            s.stop()
    base = statistics.median(systems[0].tok_s)
    print(f"\n| system | processes | output tok/s (median; min-max) | tok/s per core ({cores} cores) | vs 1 server |")
    print("|---|---|---|---|---|")
    for s in systems:
        med = statistics.median(s.tok_s)
        print(f"| {s.name} | {s.processes} | {med:.1f} ({min(s.tok_s):.1f}-{max(s.tok_s):.1f}) | {med / cores:.1f} "
              f"| {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
