"""The CPU attention kernels of two builds side by side in one process (a benchmark, not a test):
``python -m bench.investigations.attn_builds --builds OLD.so NEW.so``.

The launches are e2b_bench's (8 query heads over 1 KV head, float32 pool): extend over a 2048-token prefill chunk (4
requests x 512 rows) for a sliding layer (head_dim 32, window 128, slots running downwards as the hybrid pool hands
them out) and a full one (head_dim 64, causal, ascending slots); decode of 32 requests with 168-1063 keys for a
sliding layer (downward slots, interleaved slots) and a full one (downward, interleaved, ascending). Interleaved:
request b's key t at slot t * 32 + b, as decode tokens of 32 requests land. Each round times every case with
both builds alternating (best of the rounds per build); the two builds must give the same bits (the output says
``same`` or the largest difference). A build is the ``.so`` of ``impl_cpu_attn`` in torch's extension cache
(``~/.cache/torch_extensions/py311_cpu/impl_cpu_attn_<hash>/``): build one checkout, then the other (a ``git
worktree`` of the old commit), and give both paths."""

from __future__ import annotations

import argparse
import random
import time

from bench.investigations.decode_kernels import load_build
from bench.machine import cpu_description

HEADS, REQUESTS, CHUNK_ROWS = 8, 32, 512


def _decode_case(torch, head_dim: int, window: int, layout: str):
    r = random.Random(0)
    lens = [r.randrange(128, 1024) + 40 for _ in range(REQUESTS)]
    cap = sum(lens) + 16
    g = torch.Generator().manual_seed(1)
    q = torch.randn(REQUESTS, HEADS, head_dim, generator=g)
    k = torch.randn(cap, 1, head_dim, generator=g)
    v = torch.randn(cap, 1, head_dim, generator=g)
    slots: list[list[int]] = [[] for _ in range(REQUESTS)]
    if layout == "interleaved":
        s = 1
        for t in range(max(lens)):
            for b in range(REQUESTS):
                if t < lens[b]:
                    slots[b].append(s)
                    s += 1
    else:
        s = 1
        for b in range(REQUESTS):
            slots[b] = list(range(s, s + lens[b]))
            s += lens[b]
    kvi = torch.tensor([x for sl in slots for x in sl], dtype=torch.int64)
    if layout == "downward":
        kvi = cap - kvi
    kvp = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    qpos = torch.tensor([n - 1 for n in lens], dtype=torch.int64)
    splits = torch.ones(REQUESTS, dtype=torch.int64)

    def run(ext, o):
        ext.decode_attention(q, o, k, v, qpos, kvp, kvi, splits, 1, 0.1, window, 0.0, 1.0, 1.0, 0, 0)

    return q, run


def _extend_case(torch, head_dim: int, window: int):
    b, n = 4, CHUNK_ROWS
    cap = b * n + 16
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b * n, HEADS, head_dim, generator=g)
    k = torch.randn(cap, 1, head_dim, generator=g)
    v = torch.randn(cap, 1, head_dim, generator=g)
    kvi = (torch.arange(cap - 1, cap - 1 - b * n, -1) if window else torch.arange(1, 1 + b * n)).to(torch.int64)
    indptr = torch.arange(0, b * n + 1, n, dtype=torch.int64)
    qpos = torch.arange(n).repeat(b)

    def run(ext, o):
        ext.extend_attention(q, o, k, v, indptr, qpos, indptr, kvi, 0.1, window, 0.0, 1.0, 1.0, 0)

    return q, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", nargs=2, required=True, metavar=("A.so", "B.so"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be at least 1")

    import torch

    torch.set_num_threads(args.threads)
    builds = [load_build(p) for p in args.builds]
    cases = {
        "extend, sliding (D 32, window 128, downward slots)": (_extend_case(torch, 32, 128), 10),
        "extend, full (D 64, causal)": (_extend_case(torch, 64, 0), 10),
        "decode, sliding (D 32, window 128, downward slots)": (_decode_case(torch, 32, 128, "downward"), 30),
        "decode, sliding (D 32, window 128, interleaved slots)": (_decode_case(torch, 32, 128, "interleaved"), 30),
        "decode, full (D 64, downward slots)": (_decode_case(torch, 64, 0, "downward"), 30),
        "decode, full (D 64, interleaved slots)": (_decode_case(torch, 64, 0, "interleaved"), 30),
        "decode, full (D 64, ascending slots)": (_decode_case(torch, 64, 0, "ascending"), 30),
    }
    print(f"{cpu_description()}; {args.threads} threads; A = {args.builds[0]}, B = {args.builds[1]}")
    for name, ((q, run), calls) in cases.items():
        outs = []
        for ext in builds:
            o = torch.empty_like(q)
            run(ext, o)
            outs.append(o)
        diff = float((outs[0] - outs[1]).abs().max())
        best = [float("inf")] * 2
        for _ in range(args.rounds):
            for i, ext in enumerate(builds):
                o = torch.empty_like(q)
                t = time.perf_counter()
                for _ in range(calls):
                    run(ext, o)
                best[i] = min(best[i], (time.perf_counter() - t) / calls)
        print(f"{name}: A {best[0] * 1e6:.0f} us, B {best[1] * 1e6:.0f} us, A / B {best[0] / best[1]:.2f}x, "
              f"{'same bits' if diff == 0 else f'differ by up to {diff:.2e}'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
