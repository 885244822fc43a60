"""Two builds of the engine side by side: one full-size prefill's time, old and new checkouts alternating in fresh
processes (a C++ change cannot be switched inside one process: each checkout builds its own extensions).

    git worktree add -f /work/old <commit>
    python -m bench.investigations.prefill_ab --trees /work/old /work/main [--flag on] [--prompt 1024] [--rounds 2]
                                              [--server-args "--torchao-config 8da4w-128"]

Each process loads the checkpoint (``--model``, resolved in this checkout), prefills ``--prompt`` fresh tokens twice
unmeasured, then ``--reps`` more times (the prefix cache flushed before each); it prints the median and the fastest
of those, and the greedy first tokens, which must agree between the trees (same-bits changes keep them; a change
of summation order may move a near-tie, so they are printed rather than asserted). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _child(args) -> None:
    import torch

    from bench.profile_step import engine_kwargs
    from impl import Engine

    torch.set_num_threads(args.threads)
    eng = Engine(model_path=args.model, kv_sharing_fast_prefill=args.flag == "on", random_seed=0,
                 **engine_kwargs(args.model, args.server_args))
    sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    times, firsts = [], []
    try:
        for r in range(2 + args.reps):
            ids = [(7 + 31 * i + r) % 200_000 + 100 for i in range(args.prompt)]
            eng.flush_cache()
            t = time.perf_counter()
            out = eng.generate(input_ids=ids, sampling_params=sp)
            if r >= 2:
                times.append(time.perf_counter() - t)
                firsts.append(out["output_ids"][0])
    finally:
        eng.shutdown()
    print("AB " + json.dumps({"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "first": firsts}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"), help="two checkouts (git worktrees)")
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--flag", choices=("on", "off"), default="on")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--server-args", default="", help="engine flags (bench.profile_step.ENGINE_KEYS), e.g. \"--torchao-config 8da4w-128\"")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    if not args.trees:
        ap.error("give --trees OLD NEW")
    from bench.bench_llamacpp import resolve_model
    from bench.machine import cpu_description

    model = resolve_model(args.model)
    print(f"{args.prompt}-token prefill, flag {args.flag}, {model} {args.server_args}; CPU: {cpu_description()}; "
          f"{args.threads} threads")
    rows: dict[str, list[dict]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        for tree in args.trees:
            # this file as a script (the old tree may not have it); the engine imported from the tree
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", model, "--flag", args.flag,
                   "--prompt", str(args.prompt), "--reps", str(args.reps), "--threads", str(args.threads),
                   f"--server-args={args.server_args}"]
            env = {**os.environ, "PYTHONPATH": tree}
            res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
            line = next((ln for ln in res.stdout.splitlines() if ln.startswith("AB ")), None)
            if line is None:
                raise SystemExit(f"{tree}: no result (exit {res.returncode}):\n{res.stderr[-2000:]}")
            r = json.loads(line[3:])
            rows[tree].append(r)
            print(f"round {rnd} {tree}: median {r['median_ms']:.0f} ms, fastest {r['min_ms']:.0f} ms, first tokens {r['first']}",
                  flush=True)
    old, new = (statistics.median(x["median_ms"] for x in rows[t]) for t in args.trees)
    print(f"median of the medians: {args.trees[0]} {old:.0f} ms, {args.trees[1]} {new:.0f} ms: new / old {new / old:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
