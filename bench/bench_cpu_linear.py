"""The fused CPU kernels' linear layers: ATen's mm (MKL's sgemm) vs oneDNN's linear, and bf16 weights through
each of the extension's routes, side by side (not a test).

The fused CPU layer kernels multiply their weights through whichever route
``impl/kernels/cpu_fused/linear.py`` plans (``IMPL_CPU_LINEAR``); this prints what each choice costs on
the layer shapes of ``e2b_bench`` (hidden 256), ``e2b_bench_wide`` (hidden 512) and Gemma-4 E2B
(hidden 1536), for a decode batch and prefill blocks: GFLOP/s of ``x [M, K] @ w[N, K]^T``, median of
alternating runs.

* float32 (default): ATen mm, oneDNN on plain weights, oneDNN on prepacked weights.
* ``--bf16``: bf16 weights at E2B's shapes: the float32 GEMM rate on the same shape (the best of ATen mm
  and prepacked oneDNN: the FLOP bound the issue measures against), then the extension's ``linear`` on
  plain bf16 weights (``mkl`` route: the row kernel up to 16 rows, float32 blocks for mm above; ``onednn``
  route: oneDNN's bf16 matmul above 16 rows) and oneDNN on prepacked bf16 weights. Up to 16 rows the
  weights are cycled through copies that outgrow the last-level cache, as a decode step streams them,
  and the table adds GB/s of weights read against ``--bandwidth`` (measured here when not given).

Run it once more with ``ONEDNN_MAX_CPU_ISA=AVX2`` (and ``IMPL_CPU_MARCH=haswell`` for an AVX2 build of the
extension) to see the AVX2 paths on an AVX-512 machine.

Usage: ``python -m bench.bench_cpu_linear [--threads 2] [--reps 5] [--bf16]`` (``make bench-cpu-linear``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


import torch

SHAPES = [  # (label, N, K)
    ("e2b_bench q/o", 256, 256),
    ("e2b_bench gate or up (shared layer)", 2048, 256),
    ("e2b_bench down (shared layer)", 256, 2048),
    ("e2b_bench_wide gate or up (shared)", 4096, 512),
    ("E2B gate or up (shared)", 12288, 1536),
    ("E2B down (shared)", 1536, 12288),
]

BF16_SHAPES = [  # E2B: (label, N, K)
    ("E2B q/k/v, sliding layer", 2560, 1536),
    ("E2B o_proj, sliding layer", 1536, 2048),
    ("E2B gate+up", 12288, 1536),
    ("E2B down", 1536, 6144),
    ("E2B gate+up, shared layer", 24576, 1536),
    ("E2B down, shared layer", 1536, 12288),
]

STREAM_BYTES = 512 << 20  # weights cycled per timing up to 16 rows: well past any last-level cache


def timed(f, flops: float, reps: int) -> float:
    f()
    n = max(1, int(2e9 / flops))  # about 2 GFLOP per timing
    t = time.perf_counter()
    for _ in range(n):
        f()
    return flops * n / (time.perf_counter() - t) / 1e9


def read_bandwidth(reps: int = 5) -> float:
    """GB/s of a float32 sum over 512 MB (a read stream, as a decode step reads its weights)."""
    a = torch.ones(STREAM_BYTES // 4)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def float32_table(args, lin, cpu_linear) -> None:
    g = torch.Generator().manual_seed(0)
    print("| weight [N, K] | rows | ATen mm (MKL) | oneDNN, plain | oneDNN, prepacked | prepacked / mm |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, n, k in SHAPES:
        if args.skip_e2b and label.startswith("E2B"):
            continue
        w = torch.randn(n, k, generator=g)
        packed = cpu_linear.pack(w)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, generator=g)
            flops = 2.0 * m * n * k
            runs: dict[str, list[float]] = {"mm": [], "plain": [], "packed": []}
            for _ in range(args.reps):  # alternate the three
                runs["mm"].append(timed(lambda: torch.mm(x, w.t()), flops, args.reps))
                runs["plain"].append(timed(lambda: lin(x, w, None, "none", [], ""), flops, args.reps))
                runs["packed"].append(timed(lambda: lin(x, packed, None, "none", [], ""), flops, args.reps))
            mm, plain, pk = (statistics.median(runs[key]) for key in ("mm", "plain", "packed"))
            print(f"| {label} [{n}, {k}] | {m} | {mm:.0f} | {plain:.0f} | {pk:.0f} | {pk / mm:.2f}x |")


def bf16_table(args, lin, cpu_linear, ext) -> None:
    g = torch.Generator().manual_seed(0)
    bw = args.bandwidth or read_bandwidth()
    native = cpu_linear.native_bf16()
    print(f"memory read bandwidth {bw:.1f} GB/s{'' if args.bandwidth else ' (measured: float32 sum over 512 MB)'}; "
          f"native bf16: {cpu_linear.bf16_isa() or 'no'}; extension build: {ext.simd_isa()}")
    print()
    print("| weight [N, K] | rows | f32 GEMM bound (GFLOP/s) | bf16, mkl route | bf16, onednn route | bf16, oneDNN prepacked "
          "| best bf16 / f32 bound | weights read (GB/s, share of bandwidth) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, n, k in BF16_SHAPES:
        w32 = torch.randn(n, k, generator=g) * 0.02
        copies = 1
        for m in (int(r) for r in args.bf16_rows.split(",")):
            stream = m <= cpu_linear.BF16_ROW_KERNEL_MAX_ROWS
            copies = max(1, STREAM_BYTES // (n * k * 2)) if stream else 1
            ws = [w32.bfloat16() for _ in range(copies)]
            pk = [cpu_linear.pack(w) for w in ws]
            pk32 = cpu_linear.pack(w32)
            x = torch.randn(m, k, generator=g)
            xb = x.bfloat16()
            flops = 2.0 * m * n * k
            it = {"i": 0}

            def cycle(f, arr):
                def call():
                    i = it["i"] = (it["i"] + 1) % len(arr)
                    return f(arr[i])
                return call

            runs: dict[str, list[float]] = {k_: [] for k_ in ("mm", "f32pk", "mkl", "onednn", "packed")}
            for _ in range(args.reps):
                runs["mm"].append(timed(lambda: torch.mm(x, w32.t()), flops, args.reps))
                runs["f32pk"].append(timed(lambda: lin(x, pk32, None, "none", [], ""), flops, args.reps))
                runs["mkl"].append(timed(cycle(lambda w: ext.linear(x, w, False), ws), flops, args.reps))
                if native or args.force_onednn:
                    runs["onednn"].append(timed(cycle(lambda w: ext.linear(x, w, True), ws), flops, args.reps))
                    runs["packed"].append(timed(cycle(lambda w: lin(xb, w, None, "none", [], ""), pk), flops, args.reps))
            med = {k_: statistics.median(v) if v else float("nan") for k_, v in runs.items()}
            bound = max(med["mm"], med["f32pk"])
            best = max(v for k_, v in med.items() if k_ in ("mkl", "onednn", "packed") and v == v)
            cell = lambda v: "-" if v != v else f"{v:.0f}"  # noqa: E731
            read = ""
            if stream:
                gbs = best / (2.0 * m) * 2  # GFLOP/s -> G weight elements/s -> GB/s (2 bytes each)
                read = f"{gbs:.1f} ({gbs / bw:.0%})"
            print(f"| {label} [{n}, {k}] | {m} | {bound:.0f} | {cell(med['mkl'])} | {cell(med['onednn'])} | "
                  f"{cell(med['packed'])} | {best / bound:.2f}x | {read} |")
            del ws, pk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rows", default="32,256,2048")
    ap.add_argument("--skip-e2b", action="store_true", help="skip the E2B-sized weights (75 MB each)")
    ap.add_argument("--bf16", action="store_true", help="bf16 weights at E2B's shapes through each route")
    ap.add_argument("--bf16-rows", default="1,4,16,64,256,2048")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="GB/s to compare decode against (default: measure)")
    ap.add_argument("--force-onednn", action="store_true", help="time oneDNN's bf16 routes without native bf16 too")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl.kernels import cpu_fused
    from impl.kernels.cpu_fused import linear as cpu_linear

    if not cpu_linear.onednn_available():
        print("torch was built without oneDNN")
        return 1
    lin = torch.ops.mkldnn._linear_pointwise
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}; GFLOP/s, median of {args.reps}")
    print()
    if args.bf16:
        ext = cpu_fused.load()
        if ext is None:
            print(f"fused CPU kernels unavailable: {cpu_fused.error()}")
            return 1
        bf16_table(args, lin, cpu_linear, ext)
    else:
        float32_table(args, lin, cpu_linear)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
