"""Forward by forward, where a concurrent workload's wall time goes: ``bench_full``'s (a) (4 prompts of 1024
tokens at once, 16 new tokens each) in process, each forward's rows (prefill tokens, decode rows) and time.

    python -m bench.investigations.concurrent_trace [--model e2b-full-wc] [--server-args "--torchao-config int8dq"]
                                                    [--prompts 4] [--prompt-len 1024] [--new 16] [--flag on]

An investigation, not a test: it prints one line per forward and a summary (prefill forwards, decode forwards,
the mean decode step by batch size, the time outside forwards), so a slow tail can be told from a slow prefill.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--flag", choices=("on", "off"), default="on")
    ap.add_argument("--rounds", type=int, default=2, help="the first round warms the kernels and page cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="split each forward by phase (bench.profile_step's)")
    args = ap.parse_args(argv)

    import random

    import torch

    from bench.bench_llamacpp import resolve_model
    from bench.profile_step import engine_kwargs, profile_run
    from impl import Engine

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    eng = Engine(model_path=path, kv_sharing_fast_prefill=args.flag == "on", random_seed=0,
                 **engine_kwargs(path, args.server_args))
    log: list[tuple[int, int, float]] = []  # (prefill tokens, decode rows, seconds) per forward
    runner = eng.runner
    inner = runner.forward

    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def traced(fb):
        lens = [int(n) for n in fb.extend_seq_lens_cpu]
        if args.profile:
            box = []
            dt, ph = profile_run(lambda: box.append(inner(fb)))
            out = box[0]
            pre, dec = sum(n for n in lens if n > 1), sum(1 for n in lens if n == 1)
            key = f"prefill {pre} + decode {dec}" if pre else f"decode {dec}"
            for k, v in ph.items():
                phases[key][k] += v
        else:
            t = time.perf_counter()
            out = inner(fb)
            dt = time.perf_counter() - t
        log.append((sum(n for n in lens if n > 1), sum(1 for n in lens if n == 1), dt))
        return out

    runner.forward = traced
    try:
        sp = {"max_new_tokens": args.new, "temperature": 0, "ignore_eos": True}
        for rnd in range(args.rounds):
            rng = random.Random(rnd)
            ids = [[2] + [rng.randrange(6, 200_000) for _ in range(args.prompt_len - 1)] for _ in range(args.prompts)]
            eng.flush_cache()
            log.clear()
            t0 = time.perf_counter()
            eng.generate(input_ids=ids, sampling_params=sp)
            wall = time.perf_counter() - t0
            in_fwd = sum(dt for _, _, dt in log)
            print(f"round {rnd}: wall {wall:.2f} s, {args.prompts * args.new / wall:.2f} output tok/s, "
                  f"{len(log)} forwards, {in_fwd:.2f} s in them")
            by_batch: dict[str, list[float]] = defaultdict(list)
            for pre, dec, dt in log:
                key = f"prefill {pre} + decode {dec}" if pre else f"decode {dec}"
                by_batch[key].append(dt)
            for k, v in by_batch.items():
                print(f"  {k}: {len(v)} x {1e3 * sum(v) / len(v):.0f} ms")
                for name, sec in sorted(phases.get(k, {}).items(), key=lambda kv: -kv[1]):
                    print(f"      {1e3 * sec / len(v):8.1f} ms  {name}")
            phases.clear()
    finally:
        eng.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
