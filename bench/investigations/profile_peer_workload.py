"""Where our engine's time goes on bench_peer's workload: torch profiler, ops grouped by input shape.

    .venv/bin/python -m bench.investigations.profile_peer_workload [--fast-prefill] [--threads 2] [--by-shape]

The workload is bench_peer's (``bench_engine.workload``: 32 requests, prompts 128-1024, 64-128 new
tokens, greedy) on ``e2b_bench``, in process, with the server's CPU defaults (chunked prefill 2048). Prints
output tok/s, process CPU per output token and the top ops by self CPU time. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.bench_engine import workload
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-prefill", action="store_true", help="the flag on (default: off; the attention backend is the "
                    "server's default for Gemma-4 either way: triton, on the compiled CPU kernels)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16, help="profile rows to print")
    ap.add_argument("--by-shape", action="store_true", help="group ops by input shapes (default: by op)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    w = workload(types.SimpleNamespace(seed=0, num_requests=32, min_prompt=128, max_prompt=1024, min_output=64,
                                       max_output=128))
    extra = {"kv_sharing_fast_prefill": True} if args.fast_prefill else {}
    eng = Engine(tiny_checkpoint("e2b_bench"), dtype="float32", chunked_prefill_size=2048, **extra)
    eng.generate(input_ids=[w[0][0][:64]], sampling_params={"max_new_tokens": 4})  # warm the lazy kernels
    ids = [p for p, _ in w]
    sp = [{"max_new_tokens": m, "ignore_eos": True, "temperature": 0} for _, m in w]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t, c = time.time(), time.process_time()
        outs = eng.generate(input_ids=ids, sampling_params=sp)
        wall, cpu = time.time() - t, time.process_time() - c
    n = sum(len(o["output_ids"]) for o in outs)
    print(f"fast prefill {'on' if args.fast_prefill else 'off'}, {args.threads} threads: {n} output tokens, wall "
          f"{wall:.1f} s, {n / wall:.1f} tok/s, process CPU {1000 * cpu / n:.1f} ms per output token")
    table = prof.key_averages(group_by_input_shape=args.by_shape)
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
