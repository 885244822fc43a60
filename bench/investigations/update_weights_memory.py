"""Time and memory of ``/update_weights_from_disk`` at full size, in process (an investigation, not a test):
``python -m bench.investigations.update_weights_memory --weights 8da4w-128`` (or ``bf16``).

An engine on ``--model`` (default ``e2b-full-wc``, flag on, 2 threads) generates 8 greedy tokens after a
64-token prompt, reloads the same checkpoint through ``Engine.update_weights_from_disk`` and generates again.
Prints the update's wall time, the process's RSS before and after and its peak RSS (``/proc/self/status``) before
and after the update, and whether the greedy ids are the same. One weight format per process: the peak is the
process's high-water mark."""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints)")
    ap.add_argument("--weights", default="bf16", help="bf16, or a --torchao-config value (e.g. 8da4w-128)")
    args = ap.parse_args(argv)

    import torch

    from bench.bench_llamacpp import resolve_model
    from bench.machine import cpu_description
    from impl import Engine
    from impl.cache.memory import process_memory

    torch.set_num_threads(2)
    path = resolve_model(args.model)
    kw = {} if args.weights == "bf16" else {"torchao_config": args.weights}
    eng = Engine(model_path=path, kv_sharing_fast_prefill=True, random_seed=0, **kw)
    try:
        ids = [(7 + 31 * i) % 200_000 + 100 for i in range(64)]
        sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        before_ids = eng.generate(input_ids=ids, sampling_params=sp)["output_ids"]
        rss0, peak0 = process_memory()
        t = time.perf_counter()
        ok, msg, _ = eng.update_weights_from_disk(path)
        dt = time.perf_counter() - t
        rss1, peak1 = process_memory()
        after_ids = eng.generate(input_ids=ids, sampling_params=sp)["output_ids"]
    finally:
        eng.shutdown()
    print(f"{args.model}, {args.weights}; CPU: {cpu_description()}")
    print(f"update: {ok} ({msg}) {dt:.1f} s; RSS {rss0 / 1e9:.2f} -> {rss1 / 1e9:.2f} GB, peak RSS {peak0 / 1e9:.2f} "
          f"-> {peak1 / 1e9:.2f} GB; greedy ids the same after: {before_ids == after_ids}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
