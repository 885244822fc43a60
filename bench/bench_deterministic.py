"""What --enable-deterministic-inference costs, measured side by side in one process.

Two engines on the same checkpoint (fast prefill on, radix cache off), one default and one deterministic,
alternating: a prompt of ``--prompt`` tokens (prefill tok/s) and a short prompt with ``--decode`` new tokens
(decode tok/s at batch 1, its 16-token prefill included). Prints each round and the ratios deterministic /
default per round with their median. Needs memory for two copies of the weights (e2b-full: ~12 GB).

``python -m bench.bench_deterministic --model e2b-full`` (a checkpoint name or folder).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from bench.machine import cpu_description


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_deterministic", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="e2b-full", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one untimed warm-up round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    path = args.model if os.path.isdir(args.model) else tiny_checkpoint(args.model)
    engines = {d: Engine(path, kv_sharing_fast_prefill=True, enable_deterministic_inference=d,
                         max_total_tokens=4 * args.prompt, disable_radix_cache=True) for d in (False, True)}
    vocab = engines[False].model_config.vocab_size
    r = random.Random(0)
    long = [2] + [r.randrange(6, vocab) for _ in range(args.prompt - 1)]
    short = [2] + [r.randrange(6, vocab) for _ in range(15)]
    figures: dict[bool, dict[str, list[float]]] = {d: {"prefill tok/s": [], "decode tok/s": []} for d in engines}
    for rnd in range(args.rounds + 1):
        for d in ((False, True) if rnd % 2 == 0 else (True, False)):
            eng = engines[d]
            t = time.perf_counter()
            eng.generate(input_ids=[long], sampling_params={"max_new_tokens": 1, "temperature": 0.0})
            pre = args.prompt / (time.perf_counter() - t)
            t = time.perf_counter()
            eng.generate(input_ids=[short], sampling_params={"max_new_tokens": args.decode + 1, "temperature": 0.0,
                                                            "ignore_eos": True})
            dec = args.decode / (time.perf_counter() - t)
            if rnd:  # round 0 warms both engines
                figures[d]["prefill tok/s"].append(pre)
                figures[d]["decode tok/s"].append(dec)
    print(f"{path}; {cpu_description()}; {args.threads} threads; fast prefill on, radix cache off")
    for d in engines:
        print(f"  {'deterministic' if d else 'default'}: " + "; ".join(
            f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in figures[d].items()))
    for k in figures[False]:
        ratios = [a / b for a, b in zip(figures[True][k], figures[False][k])]
        print(f"  {k}, deterministic / default per round: {', '.join(f'{x:.3f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
