"""Decode rate of one build at full size: ``python -m bench.investigations.decode_rate [--format int8dq]``. One engine,
flag on, a 64-token prompt then 64 greedy tokens (EOS ignored), twice after a warm-up, best kept; prints tok/s (the
prompt's prefill included) and the first ids. Two builds are compared by running it alternately in a checkout of
each (``git worktree add``), as docs/benchmarks.md's W8A8 tile-order section did."""

from __future__ import annotations

import argparse
import time

from bench.machine import cpu_description


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--format", default="bf16", help="bf16 (the checkpoint's weights) or a --torchao-config value")
    ap.add_argument("--tokens", type=int, default=64, help="prompt tokens and new tokens")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")

    import torch

    from bench.bench_llamacpp import resolve_model
    from impl import Engine

    torch.set_num_threads(args.threads)
    eng = Engine(model_path=resolve_model(args.model), kv_sharing_fast_prefill=True, random_seed=0,
                 **({} if args.format == "bf16" else {"torchao_config": args.format}))
    ids = [(7 + 31 * i) % 200_000 + 100 for i in range(args.tokens)]
    try:
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
        best, out = 0.0, {}
        for _ in range(2):
            eng.flush_cache()
            t = time.perf_counter()
            out = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": args.tokens + 1, "temperature": 0,
                                                               "ignore_eos": True})
            best = max(best, args.tokens / (time.perf_counter() - t))
    finally:
        eng.shutdown()
    print(f"{args.model} {args.format}, flag on, {args.threads} threads; CPU: {cpu_description()}")
    print(f"decode ~{best:.2f} tok/s ({args.tokens} tokens after a {args.tokens}-token prompt, its prefill included); "
          f"first ids {out.get('output_ids', [])[:6]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
