"""oneDNN's matmuls inside a full-size prefill, shape by shape, beside the same shapes timed alone: where the
in-model rate falls below what the kernel does by itself.

    python -m bench.investigations.gemm_shapes [--model e2b-full-wc] [--flag on] [--prompt 1024] [--top 6]

In process, 2 threads: the engine as the server builds it prefills ``--prompt`` fresh tokens three times, then once
under ``torch.profiler`` with the input shapes recorded; every ``mkldnn::_linear_pointwise`` call is grouped by
shape (rows M, input K, output N): calls, ms per call, TFLOP/s (2 M K N per call) and the weight's GB/s. The ``--top``
shapes by total time are then timed alone: prepacked copies of a random weight of that shape cycled until ~1 GiB has
passed (more than the L3 of the VMs met so far, 480 MB on the AMX Xeon: each call finds its weight in memory, as a
prefill does), random rows, in the model's weight dtype (bf16 at full size; float32 for e2b_bench), the best of 3
passes. The last column is in-model time over alone time.

An investigation, not a test (a quiet machine; run it alone)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict


def _shapes(prof) -> dict[tuple[int, int, int], list[float]]:
    """(M, K, N) -> [calls, seconds] of the profiled oneDNN linears."""
    out: dict[tuple[int, int, int], list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.key_averages(group_by_input_shape=True):
        if ev.key != "mkldnn::_linear_pointwise" or not ev.input_shapes or len(ev.input_shapes[0]) != 2:
            continue
        (m, k), n = ev.input_shapes[0], ev.input_shapes[1][0]
        rec = out[(m, k, n)]
        rec[0] += ev.count
        rec[1] += ev.self_cpu_time_total / 1e6
    return out


def _alone(m: int, k: int, n: int, ext, dtype, budget_bytes: int = 1 << 30) -> float:
    """Seconds per call of an [m, k] x [k, n] matmul in the model's dtype (bf16 or float32) on prepacked weights
    cycled from memory."""
    import torch

    from impl.kernels.cpu_fused.linear import pack

    g = torch.Generator().manual_seed(0)
    copies = max(2, budget_bytes // (dtype.itemsize * k * n))
    base = (torch.randn(n, k, generator=g) * 0.02).to(dtype)
    ws = [pack(base) for _ in range(copies)]
    x = torch.randn(m, k, generator=g).to(dtype)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for w in ws:
            ext.linear_native(x, w, True)
        best = min(best, (time.perf_counter() - t) / copies)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--flag", choices=("on", "off"), default="on")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--top", type=int, default=6, help="how many shapes (by in-model time) to time alone")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.bench_llamacpp import resolve_model
    from bench.machine import cpu_description
    from impl import Engine
    from impl.kernels import cpu_fused

    torch.set_num_threads(args.threads)
    ext = cpu_fused.load()
    if ext is None:
        raise SystemExit(f"the cpu_fused extension is unavailable: {cpu_fused.error()}")
    eng = Engine(model_path=resolve_model(args.model), kv_sharing_fast_prefill=args.flag == "on", random_seed=0)
    sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}

    vocab = eng.model_config.vocab_size  # ids past 100 inside the vocabulary (the small checkpoints' is 512)
    span = max(1, min(200_000, vocab - 100))

    def prompt(seed: int) -> list[int]:
        return [(7 + 31 * i + seed) % span + min(100, vocab - 1) for i in range(args.prompt)]

    try:
        for r in range(3):  # warm: kernels, primitives, page cache, the allocator's arenas
            eng.flush_cache()
            eng.generate(input_ids=prompt(r), sampling_params=sp)
        eng.flush_cache()
        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            eng.generate(input_ids=prompt(99), sampling_params=sp)
        wall = time.perf_counter() - t
        dtype = eng.runner.dtype  # the weights' dtype: the shapes alone run in it
    finally:
        eng.shutdown()
    shapes = sorted(_shapes(prof).items(), key=lambda kv: -kv[1][1])
    total = sum(s for _, (_, s) in shapes)
    print(f"{args.model}, flag {args.flag}, {args.prompt}-token prefill: {wall * 1e3:.0f} ms under the profiler, oneDNN "
          f"linears {total * 1e3:.0f} ms. CPU: {cpu_description()}; {args.threads} threads.\n")
    print("| M | K | N | calls | in model ms/call | TFLOP/s | weight GB/s | alone ms/call | TFLOP/s | in model / alone |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, ((m, k, n), (calls, secs)) in enumerate(shapes):
        per = secs / calls
        flops, wbytes = 2.0 * m * k * n, float(dtype.itemsize * k * n)
        row = f"| {m} | {k} | {n} | {int(calls)} | {per * 1e3:.3f} | {flops / per / 1e12:.2f} | {wbytes / per / 1e9:.1f} |"
        if i < args.top:
            alone = _alone(m, k, n, ext, dtype)
            row += f" {alone * 1e3:.3f} | {flops / alone / 1e12:.2f} | {per / alone:.2f}x |"
        else:
            row += " | | |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
