"""One full-size prefill in two or more weight formats, side by side in one process (a benchmark, not a test):
``python -m bench.investigations.prefill_formats --flag on --formats bf16,int8dq --rounds 10``.

Every format's engine is loaded first (bf16 9 GB, int8dq ~5 GB: both fit 23 GiB), then the rounds alternate between
them (one fresh 1024-token prefill each, prefix cache flushed), so a shared machine's drift lands on every format
alike. Prints each format's times, its best and median, and the median ratio of each format to the first."""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import cpu_description


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--flag", choices=("on", "off"), default="on", help="--kv-sharing-fast-prefill")
    ap.add_argument("--formats", default="bf16,int8dq", help="bf16 (the checkpoint's weights) or --torchao-config values")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2,
                    help="unmeasured alternating rounds first (the page cache and the embedding read-ahead settle)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    if len(formats) < 2 or args.rounds < 1 or args.warmup < 0:
        ap.error("give two or more formats, at least one round and no negative warmup")

    import torch

    from bench.bench_llamacpp import resolve_model
    from impl import Engine

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    engines = {f: Engine(model_path=path, kv_sharing_fast_prefill=args.flag == "on", random_seed=0,
                         **({} if f == "bf16" else {"torchao_config": f})) for f in formats}
    ids = [(7 + 31 * i) % 200_000 + 100 for i in range(args.prompt)]
    sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    times: dict[str, list[float]] = {f: [] for f in formats}
    try:
        for e in engines.values():
            e.generate(input_ids=ids[:64], sampling_params=sp)  # the lazy kernels built and warm
        for r in range(args.warmup + args.rounds):
            for f, e in engines.items():
                e.flush_cache()
                t = time.perf_counter()
                e.generate(input_ids=ids, sampling_params=sp)
                if r >= args.warmup:
                    times[f].append(time.perf_counter() - t)
    finally:
        for e in engines.values():
            e.shutdown()
    print(f"{args.model}, {args.prompt}-token prefill, flag {args.flag}, {args.threads} threads, {args.rounds} rounds "
          f"alternating after {args.warmup} unmeasured; CPU: {cpu_description()}")
    base = statistics.median(times[formats[0]])
    for f in formats:
        med = statistics.median(times[f])
        print(f"{f:10s} ms: {' '.join(f'{t * 1e3:.0f}' for t in times[f])} | best {min(times[f]) * 1e3:.0f}, median "
              f"{med * 1e3:.0f} ({args.prompt / med:.0f} tok/s) | {base / med:.2f}x {formats[0]}'s speed (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
