"""The bf16 row kernel (decode's bf16 linears and LM head: ``cpu_fused.bf16_rows``) from memory at E2B's decode
shapes: the tied LM head [262144 x 1536] alone, and twelve MLP weights cycled (six gate / up [24576 x 1536], six
down [1536 x 12288]: 680 MB, beyond any cache), at 1 and 4 rows; the best of 5 passes, as GB/s of weight bytes.

    python -m bench.investigations.bf16_rows_rate [--threads 2]

An investigation, not a test: run it from two worktrees to compare builds (the extension is built per source).
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from impl.kernels import cpu_fused

    torch.set_num_threads(args.threads)
    ext = cpu_fused.load()
    if ext is None:
        raise SystemExit(f"the cpu_fused extension is unavailable: {cpu_fused.error()}")
    g = torch.Generator().manual_seed(0)

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)

    sets = {"LM head 262144 x 1536": [weight(262144, 1536)],
            "MLP, 12 weights cycled": [weight(24576, 1536) for _ in range(6)] + [weight(1536, 12288) for _ in range(6)]}
    for rows in (1, 4):
        xs = {k: torch.randn(rows, k, generator=g) for k in (1536, 12288)}
        for name, ws in sets.items():
            nbytes = sum(w.numel() * 2 for w in ws)
            best = float("inf")
            for _ in range(args.passes):
                t = time.perf_counter()
                for w in ws:
                    ext.bf16_rows(xs[w.shape[1]], w)
                best = min(best, time.perf_counter() - t)
            print(f"{rows} row(s), {name}: {best * 1e3:.1f} ms, {nbytes / best / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
