"""Fused CPU kernels vs the torch code they replace, side by side in one run (not a test).

For each kernel and shape: median time per call of the C++ kernel and of the torch path
(``impl/kernels/cpu_fused/reference.py`` for the layer pieces; the torch_native backend's own
functions for attention), and their ratio. Shapes are the tiny e2b checkpoint's: hidden 64,
4 heads / 1 KV head, head_dim 16 (sliding) / 32 (full), MLP 128 (256 double-wide), PLE 8;
32 rows is a decode step of the engine benchmark's batch, 2048 rows a prefill chunk.

Usage: ``python -m bench.bench_cpu_fused [--threads 1]`` (``make bench-cpu-fused``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


import torch


def timed(fn, args, reps: int) -> float:
    """Median seconds per call over ``reps`` calls (after one warm-up)."""
    fn(*args)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl.attention.base import AttentionLayer
    from impl.attention.torch_native import _attend_rows, _bias, _gather
    from impl.kernels import cpu_attn, cpu_fused
    from impl.kernels.cpu_fused import reference as ref

    ext = cpu_fused.load()
    if ext is None:
        print(f"fused CPU kernels unavailable: {cpu_fused.error()}")
        return 1
    g = torch.Generator().manual_seed(args.seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    rows = []

    def add(name: str, fused, torch_path, fargs, targs, reps: int) -> None:
        tf, tt = timed(fused, fargs, reps), timed(torch_path, targs, reps)
        rows.append((name, tt, tf))

    hid = 64
    for n in (32, 2048):
        reps = 2000 if n == 32 else 50
        for d, heads, label in ((16, 6, "sliding, owns KV"), (32, 4, "full, KV-shared")):
            q_heads = 4
            pre = (r(n, hid), r(hid), r(heads * d, hid), r(heads, d), r(n, d), r(n, d), q_heads, 1e-6)
            add(f"attn_pre, {n} rows, {label} (head_dim {d})", ext.attn_pre, ref.attn_pre, pre, pre, reps)
        for inter in (128, 256):
            post = [r(n, hid), r(n, 64), r(hid, 64), r(hid), r(hid), [r(2 * inter, hid)], r(hid, inter), r(hid),
                    r(n, 35, 8)[:, 3], r(8, hid), r(hid, 8), r(hid), 0.7, 1e-6]
            add(f"decoder_post, {n} rows, MLP {inter}", ext.decoder_post, ref.decoder_post, post, post, reps)

    # Attention of one query row per request over the paged pool (decode), e2b shapes, Hkv = 1.
    b, slots, ctx = 32, 60000, 1200
    lengths = torch.randint(128, 1152, (b,), generator=g)
    r2t = torch.randperm(slots, generator=g)[: b * ctx].view(b, ctx)
    row_req = torch.arange(b)
    q_pos = lengths - 1
    for d, window, label in ((16, 16, "sliding window 16"), (32, 0, "full")):
        k_buf, v_buf = r(slots, 1, d), r(slots, 1, d)
        q = r(b, 4, d)
        layer = AttentionLayer(layer_id=0, kv_layer_id=0, num_heads=4, num_kv_heads=1, head_dim=d,
                               sliding_window=window or None)
        w = window or int(lengths.max())
        kpos = q_pos[:, None] + torch.arange(1 - w, 1)[None, :]  # [b, w] (window: its keys; full: padded)
        kslots = r2t[row_req[:, None], kpos.clamp(min=0)]
        bias = _bias(kpos >= 0)

        def torch_path(q=q, k_buf=k_buf, v_buf=v_buf, kslots=kslots, bias=bias, layer=layer):
            ks, vs = _gather(k_buf, v_buf, kslots)  # what torch_native does per KV layer and step
            return _attend_rows(q, ks, vs, bias, layer)

        fargs = (q, k_buf, v_buf, r2t, row_req, q_pos, window, 1.0, 0.0)
        # (the compiled rows kernel of impl/kernels/cpu_attn, which torch_native runs on CPU)
        add(f"attention, {b} decode rows, {label} (contexts 128-1151)", cpu_attn.rows_attention, torch_path, fargs, (), 200)

    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores visible; median per call")
    print()
    print("| piece | torch path (us) | fused kernel (us) | torch / fused |")
    print("|---|---:|---:|---:|")
    for name, tt, tf in rows:
        print(f"| {name} | {tt * 1e6:.1f} | {tf * 1e6:.1f} | {tt / tf:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
