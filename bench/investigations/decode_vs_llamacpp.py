"""Batch-1 decode, ours against llama.cpp, in alternating rounds on one machine (a benchmark, not a test):
``python -m bench.investigations.decode_vs_llamacpp --pairs 8da4w-128:q4_0,int8dq:q8_0 [--rounds 2]``.

For each pair (our ``--torchao-config`` value or ``bf16``, and a llama.cpp quant type whose GGUF
``bench/bench_llamacpp.py --phase convert`` made) and each round: our engine (in process, default flags, flag on,
2 threads) decodes ``--tokens`` greedy tokens after a 16-token prompt, timed without its prefill (the time of
``tokens + 1`` new tokens less that of 1); then ``llama-bench -p 0 -n <tokens> -r 1`` (2 threads) on the GGUF.
Our engine is built once per pair and kept while llama-bench runs (it holds its weights; llama-bench maps its
own). ``make bench-quant-full`` measures the same tg128 through servers, one system at a time; this alternates
the two in one process tree, so a shared machine's drift (memory bandwidth moves by 2x over minutes on some
hosts) falls on both sides. Prints each round and the median ratio per pair."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from bench.machine import cpu_description


def ours_decode(eng, tokens: int) -> float:
    """tok/s of ``tokens`` greedy decode steps (the prefill's time taken out)."""
    ids = [(7 + 31 * i) % 200_000 + 100 for i in range(16)]

    def run(n: int) -> float:
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
        return time.perf_counter() - t

    return tokens / (run(tokens + 1) - run(1))


def llama_tg(bin_dir: str, gguf: str, tokens: int) -> float:
    out = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", gguf, "-p", "0", "-n", str(tokens), "-t", "2",
                          "-r", "1", "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints)")
    ap.add_argument("--pairs", default="8da4w-128:q4_0,int8dq:q8_0", help="ours:llama.cpp, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    pairs = [p.split(":") for p in args.pairs.split(",")]
    if any(len(p) != 2 for p in pairs) or args.tokens < 1 or args.rounds < 1:
        ap.error("--pairs takes ours:quant entries; --tokens and --rounds at least 1")

    import torch

    from bench.bench_llamacpp import CACHE, build, gguf_path, resolve_model
    from impl import Engine

    torch.set_num_threads(2)
    path = resolve_model(args.model)
    bin_dir = build(CACHE)
    name = os.path.basename(path.rstrip("/"))
    print(f"{args.model}: decode of {args.tokens} tokens, 2 threads; CPU: {cpu_description()}", flush=True)
    for ours, quant in pairs:
        gguf = gguf_path(os.path.join(CACHE, "gguf"), name, quant)
        if not os.path.exists(gguf):
            raise SystemExit(f"{gguf} is missing: run python -m bench.bench_llamacpp --phase convert --model {args.model}")
        eng = Engine(model_path=path, kv_sharing_fast_prefill=True, random_seed=0, disable_radix_cache=True,
                     **({} if ours == "bf16" else {"torchao_config": ours}))
        try:
            ours_decode(eng, 4)  # warm-up
            ratios = []
            for r in range(args.rounds):
                a = ours_decode(eng, args.tokens)
                b = llama_tg(bin_dir, gguf, args.tokens)
                ratios.append(a / b)
                print(f"  round {r + 1}: ours {ours} {a:.2f} tok/s, llama.cpp {quant} {b:.2f} tok/s: {a / b:.2f}x "
                      f"({time.strftime('%H:%M:%S')})", flush=True)
            print(f"{ours} vs {quant}: median {statistics.median(ratios):.2f}x", flush=True)
        finally:
            eng.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
