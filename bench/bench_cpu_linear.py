"""ATen's mm (MKL's sgemm) vs oneDNN's linear, plain and prepacked weights, side by side (not a test).

The fused CPU layer kernels multiply their weights through whichever library
``impl/kernels/cpu_fused/linear.py`` plans (``IMPL_CPU_LINEAR``); this prints what each choice costs on
the layer shapes of ``e2b_bench`` (hidden 256), ``e2b_bench_wide`` (hidden 512) and Gemma-4 E2B
(hidden 1536), for a decode batch (32 rows) and prefill blocks (256 and 2048 rows): GFLOP/s of
``x [M, K] @ w[N, K]^T``, float32, median of alternating runs. Run it once more with
``ONEDNN_MAX_CPU_ISA=AVX2`` to see oneDNN without AVX-512 (MKL keeps to AVX2 on AMD CPUs anyway).

Usage: ``python bench/bench_cpu_linear.py [--threads 2] [--reps 5]`` (``make bench-cpu-linear``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SHAPES = [  # (label, N, K)
    ("e2b_bench q/o", 256, 256),
    ("e2b_bench gate or up (shared layer)", 2048, 256),
    ("e2b_bench down (shared layer)", 256, 2048),
    ("e2b_bench_wide gate or up (shared)", 4096, 512),
    ("E2B gate or up (shared)", 12288, 1536),
    ("E2B down (shared)", 1536, 12288),
]


def timed(f, flops: float, reps: int) -> float:
    f()
    n = max(1, int(2e9 / flops))  # about 2 GFLOP per timing
    t = time.perf_counter()
    for _ in range(n):
        f()
    return flops * n / (time.perf_counter() - t) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rows", default="32,256,2048")
    ap.add_argument("--skip-e2b", action="store_true", help="skip the E2B-sized weights (75 MB each)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl.kernels.cpu_fused import linear as cpu_linear

    if not cpu_linear.onednn_available():
        print("torch was built without oneDNN")
        return 1
    lin = torch.ops.mkldnn._linear_pointwise
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}; GFLOP/s, median of {args.reps}")
    print()
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
            runs = {"mm": [], "plain": [], "packed": []}
            for _ in range(args.reps):  # alternate the three
                runs["mm"].append(timed(lambda: torch.mm(x, w.t()), flops, args.reps))
                runs["plain"].append(timed(lambda: lin(x, w, None, "none", [], ""), flops, args.reps))
                runs["packed"].append(timed(lambda: lin(x, packed, None, "none", [], ""), flops, args.reps))
            mm, plain, pk = (statistics.median(runs[key]) for key in ("mm", "plain", "packed"))
            print(f"| {label} [{n}, {k}] | {m} | {mm:.0f} | {plain:.0f} | {pk:.0f} | {pk / mm:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
