"""One vs two torch threads on the same forwards, wall and process CPU time (not a test).

On a shared host a 2-thread OpenMP pool can lose to one thread: every parallel region ends at a
barrier, and when the other thread is descheduled the waiting one spins (GNU OpenMP's default wait
policy) or sleeps (``OMP_WAIT_POLICY=PASSIVE``). This prints, alternating 1 and 2 threads, the wall and
CPU seconds of a 1024-token prefill (4 x 256) and of 32 such prompts plus 8 decode steps each, on one
engine (flag off, the default CPU backend). Run it with and without ``OMP_WAIT_POLICY=PASSIVE``.

Usage: ``OMP_NUM_THREADS=2 python -m bench.investigations.bench_omp_threads [--model e2b_bench] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import os
import time


import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="e2b_bench")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    eng = Engine(path, dtype="float32", random_seed=0, context_length=2048, disable_radix_cache=True)
    g = torch.Generator().manual_seed(1)
    prompts = [[2] + torch.randint(3, 500, (255,), generator=g).tolist() for _ in range(4)]
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, model {args.model}", flush=True)
    for _ in range(args.rounds):
        for n in (1, 2):
            torch.set_num_threads(n)
            eng.generate(input_ids=prompts[:1], sampling_params={"max_new_tokens": 1})  # warm the pool
            for label, ids, new in (("prefill 4 x 256", prompts, 1), ("32 x 256 + 8 decode", prompts * 8, 8)):
                t, c = time.perf_counter(), time.process_time()
                eng.generate(input_ids=ids, sampling_params={"max_new_tokens": new, "ignore_eos": True})
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                print(f"  {n} thread(s), {label}: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
    eng.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
