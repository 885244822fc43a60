"""``bench_full``'s (a) against one fresh server, several times: whether the first run after startup is slower
than the later ones (an investigation, not a test).

    python -m bench.investigations.concurrent_server --system ours --server-args "--torchao-config int8dq" --reps 3
    python -m bench.investigations.concurrent_server --system vllm --model .cache/checkpoints/e2b-full-wc-w8a8

Each run: 4 prompts of 1024 fresh random tokens at once, 16 new tokens each (greedy, streamed; ``--prompt-len`` and
``--new`` change both), as ``bench_full``'s
(a), after its 16-token warm-up request; prints output tok/s, the median time to the first token and each
request's. The page cache is warmed first (``bench_full.warm_page_cache``); fast prefill is on.

``--pp N`` runs ``bench_full``'s pp N instead: one fresh prompt of N tokens at a time, 1 new token, ``--reps`` times,
printing each time to the first token and N / that time (``bench_full`` keeps the best of its reps). To compare two
commits, run the tool from a ``git worktree`` of each, alternating: the server runs the checkout the tool ran from.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=("ours", "vllm"), default="ours")
    ap.add_argument("--model", default="e2b-full-wc")
    ap.add_argument("--server-args", default="", help="extra flags for the server")
    ap.add_argument("--vllm-kv-gib", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=0, metavar="N", help="pp N (one N-token prompt at a time) instead of (a)")
    ap.add_argument("--prompt-len", type=int, default=1024, help="(a)'s prompt length (bench_full: 1024)")
    ap.add_argument("--new", type=int, default=16, help="(a)'s new tokens per request (bench_full: 16)")
    ap.add_argument("--log-dir", default="/tmp/concurrent_server_logs")
    args = ap.parse_args(argv)

    from bench.bench_full import (ROOT, Result, ensure_vllm, one_request, our_server, prompts_of, run_concurrent,
                                  start_sampled, vllm_server, warm_page_cache)
    from bench.bench_llamacpp import resolve_model
    from bench.bench_peer import free_port
    from bench.machine import cpu_description
    from impl.config.model_config import ModelConfig

    path = resolve_model(args.model)
    vocab = ModelConfig.from_pretrained(path).vocab_size
    extra = shlex.split(args.server_args)
    print(f"page cache warmed in {warm_page_cache(path):.0f} s; CPU: {cpu_description()}", flush=True)
    if args.system == "ours":
        srv = our_server(path, True, free_port(), extra)
    else:
        srv = vllm_server(ensure_vllm(os.path.join(ROOT, ".cache", "vllm-venv")), path, True, free_port(), extra,
                          args.vllm_kv_gib)
    os.makedirs(args.log_dir, exist_ok=True)
    load_s, _ = start_sampled(srv, args.log_dir, 2400)
    print(f"{srv.name} {' '.join(extra)}: up in {load_s:.0f} s", flush=True)
    try:
        model = srv.model_id()
        one_request(srv.url, model, prompts_of(99, [16], vocab)[0], 2, time.perf_counter(), Result())
        if args.pp:
            tok_s = []
            for rep in range(args.reps):
                (r,) = run_concurrent(srv, prompts_of(1000 + rep, [args.pp], vocab), 1)
                tok_s.append(args.pp / r.t_first)
                print(f"  pp{args.pp} run {rep}: TTFT {r.t_first:.3f} s, {tok_s[-1]:.1f} tok/s", flush=True)
            print(f"  pp{args.pp}: best {max(tok_s):.1f}, median {statistics.median(tok_s):.1f} tok/s", flush=True)
        for rep in range(0 if args.pp else args.reps):
            t = time.perf_counter()
            res = run_concurrent(srv, prompts_of(rep, [args.prompt_len] * 4, vocab), args.new)
            wall = time.perf_counter() - t
            firsts = [round(r.t_first, 2) for r in res]
            # after the last first token all four decode together: the mean step of that stretch
            step = (wall - max(firsts)) / max(1, min(len(r.ids) for r in res) - 1)
            print(f"  run {rep}: {sum(len(r.ids) for r in res) / wall:.2f} output tok/s, median TTFT "
                  f"{statistics.median(firsts):.2f} s (each: {firsts}), decode step after the last first token "
                  f"~{step * 1e3:.0f} ms", flush=True)
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
