"""Decode's quantized row kernels, two builds of the fused CPU extension side by side in one process (a benchmark,
not a test): ``python -m bench.investigations.decode_kernels --builds OLD.so NEW.so --format w4a8 --rows 1``.

The weights: 12 copies of one E2B layer's linears (q 2048 x 1536, k / v 512 x 1536, o 1536 x 2048, gate / up 12288 x
1536 as one, down 1536 x 6144), packed in the format, about a quarter of a decode step's bytes (more than any
cache). Each round times ``quant_linear`` over all of them with ``--rows`` rows of x (1: batch-1 decode), the two
builds alternating, with the engine's allocator setting (``impl.engine.allocator``: without it every large output is
a fresh zero-filled mapping, and the page faults hide what the kernels' stores cost); both must give the same bits
(``--arithmetic-changed``: the same to float rounding). Prints each build's median, its GB/s of packed weights and
the ratio. A build is the ``.so`` of ``impl_cpu_fused`` in torch's extension cache
(``~/.cache/torch_extensions/py311_cpu/impl_cpu_fused_<hash>/``): build one checkout, then the other (a
``git worktree`` of the old commit), and give both paths."""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

from bench.machine import cpu_description

SHAPES = ((2048, 1536), (512, 1536), (512, 1536), (1536, 2048), (12288, 1536), (1536, 6144))


def load_build(path: str):
    name = os.path.basename(path).removesuffix(".so")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a loadable extension")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", nargs=2, required=True, metavar=("A.so", "B.so"))
    ap.add_argument("--format", default="w4a8", help="w8a8, w8a16, w4a16 or w4a8")
    ap.add_argument("--group", type=int, default=128, help="int4 group size")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tile-order", action="store_true",
                    help="w8a8 / w4a8: each build's copy of the weights in AMX tile order as that build lays them out "
                         "(its quant_tile_order_, or an older build's w8a8_tile_order_: a build that does not tile a "
                         "format keeps its row layout), as the engine keeps them where the CPU has AMX-int8")
    ap.add_argument("--arithmetic-changed", action="store_true",
                    help="the builds add terms differently: outputs must agree to float rounding, not bit for bit")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.copies < 1 or args.rounds < 1:
        ap.error("--rows, --copies and --rounds must be at least 1")

    import torch

    from impl.quant.base import INT4_KINDS, WeightFormat
    from impl.quant.pack import pack

    torch.set_num_threads(args.threads)
    from impl.engine.allocator import keep_freed_memory

    keep_freed_memory()  # as the engine: outputs reuse freed memory rather than fresh (zero-filled) pages
    torch.manual_seed(0)
    int4 = args.format in INT4_KINDS
    fmt = WeightFormat(args.format, args.group if int4 else 0, symmetric=not int4)
    builds = [load_build(p) for p in args.builds]
    packed = {s: pack(torch.randn(*s) * 0.03, fmt) for s in set(SHAPES)}
    ks = [k for _ in range(args.copies) for _, k in SHAPES]  # each weight's in_features
    if args.tile_order and args.format not in ("w8a8", "w4a8"):
        ap.error("--tile-order is for --format w8a8 or w4a8")

    def copies(m):  # one build's weights (its own tile order with --tile-order)
        ws = [packed[s].clone() for _ in range(args.copies) for s in SHAPES]
        if not args.tile_order:
            return ws
        tile = getattr(m, "quant_tile_order_", None) or m.w8a8_tile_order_
        return [tile(w, k) for w, k in zip(ws, ks)]

    first = copies(builds[0])  # one set both builds read in row layout; each its own in tile order
    weights = [first, copies(builds[1]) if args.tile_order else first]
    xs = {k: torch.randn(args.rows, k).bfloat16() for _, k in SHAPES}
    for wa, wb, k in zip(weights[0][: len(SHAPES)], weights[1], ks):
        a, b = builds[0].quant_linear(xs[k], wa), builds[1].quant_linear(xs[k], wb)
        same = torch.equal(a, b) or (args.arithmetic_changed and torch.allclose(a, b, rtol=1e-5, atol=1e-5))
        if not same:
            raise SystemExit(f"the builds differ on a {tuple(wa.shape)} weight: {(a - b).abs().max().item():.3g}")
    nbytes = sum(w.numel() for w in weights[0])
    times: list[list[float]] = [[], []]
    for _ in range(args.rounds):
        for m, ws, t in zip(builds, weights, times):
            start = time.perf_counter()
            for w, k in zip(ws, ks):
                m.quant_linear(xs[k], w)
            t.append(time.perf_counter() - start)
    med = [statistics.median(t) for t in times]
    order = " in tile order" if args.tile_order else ""
    print(f"{fmt.name()}{order}, {args.rows} row(s) of x, {nbytes / 1e9:.2f} GB of weights, {args.threads} threads; "
          f"CPU: {cpu_description()}")
    for path, m in zip(args.builds, med):
        print(f"  {os.path.basename(path)}: median {m * 1e3:.1f} ms ({nbytes / m / 1e9:.1f} GB/s)")
    print(f"  B / A time: {med[1] / med[0]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
