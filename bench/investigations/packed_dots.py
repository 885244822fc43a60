"""bf16 weights at decode-size row counts, three kernels side by side in one process (a benchmark, not a test):
``python -m bench.investigations.packed_dots [--rows 1,2,4,6,8,12,16]``.

The weights: 8 of E2B's layer shapes in bf16 (2560 x 1536, 1536 x 2048, 6144 x 1536 twice, 1536 x 6144, 12288 x 1536
twice, 1536 x 12288: 184 MB, past any L3). For each row count x, one pass over all of them with

* ``packed dots``: the weights prepacked for oneDNN (``linear.pack(w, dots=True)``, the default bf16 plan's copy) and
  read in place by the extension's bf16 dot products (``packed_dot_rows``, packed_dot.cpp);
* ``oneDNN prepacked``: oneDNN's bf16 matmul on the same packed copies (``mkldnn._linear_pointwise``: what the plan
  runs above 16 rows, and at every row count under ``IMPL_CPU_PACKED_DOTS=0``);
* ``plain dots``: the plain weights read by ``bf16_dot_rows`` (the in-place plan, ``IMPL_CPU_LINEAR=onednn``).

The kernels alternate within each round; the table gives the median pass (ms) over the rounds and the weights' GB/s.
A shape whose packed copy is not laid out as the dot products read it (``packed_dot_block`` 0: another oneDNN layout,
e.g. AMX's) is reported, and the packed-dots column is left out, as the engine then keeps oneDNN for it. Needs a
build with AVX-512 BF16 (the dot products) and torch with oneDNN."""

from __future__ import annotations

import argparse
import statistics
import time

from bench.machine import cpu_description

SHAPES = ((2560, 1536), (1536, 2048), (6144, 1536), (6144, 1536), (1536, 6144), (12288, 1536), (12288, 1536),
          (1536, 12288))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,6,8,12,16", help="x row counts (1-16: the dot products' range)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    if not rows or min(rows) < 1 or max(rows) > 16 or args.rounds < 1 or args.threads < 1:
        ap.error("--rows must be 1-16, --rounds and --threads at least 1")

    import torch

    from impl.kernels import cpu_fused
    from impl.kernels.cpu_fused import linear as cpu_linear

    torch.set_num_threads(args.threads)
    ext = cpu_fused.load()
    if ext is None or not ext.bf16_dot_rows_here() or not cpu_linear.onednn_available():
        raise SystemExit("needs the fused extension built with AVX-512 BF16 (bf16_dot_rows_here) and torch's oneDNN")
    g = torch.Generator().manual_seed(0)
    plain = [(torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16) for n, k in SHAPES]
    packed = [cpu_linear.pack(w, dots=True) for w in plain]
    blocks = [int(ext.packed_dot_block(p)) for p in packed]
    nbytes = sum(w.numel() * 2 for w in plain)
    lin = torch.ops.mkldnn._linear_pointwise
    ks = [k for _, k in SHAPES]
    # each kernel: one pass over every weight, each with the x of its input width (xs: width -> [rows, width])
    kernels = {"oneDNN prepacked": lambda xs: [lin(xs[k], p, None, "none", [], "") for k, p in zip(ks, packed)],
               "plain dots": lambda xs: [ext.bf16_dot_rows(xs[k], w) for k, w in zip(ks, plain)]}
    if all(blocks):
        kernels = {"packed dots": lambda xs: [ext.packed_dot_rows(xs[k], p) for k, p in zip(ks, packed)], **kernels}
    layout = ", ".join(f"{n}x{k} {b or 'no'}" for (n, k), b in zip(SHAPES, blocks))
    print(f"{cpu_description()}; {args.threads} threads; {len(SHAPES)} weights, {nbytes / 1e6:.0f} MB bf16; packed "
          f"layout read in place (block width): {layout}")
    print()
    print("| x rows | " + " | ".join(f"{name}: ms (GB/s)" for name in kernels) + " |")
    print("|---:|" + "---:|" * len(kernels))
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g).to(torch.bfloat16) for k in set(ks)}
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for f in kernels.values():  # each kernel's first call (oneDNN's primitive cache) untimed
            f(xs)
        for _ in range(args.rounds):
            for name, f in kernels.items():
                t = time.perf_counter()
                f(xs)
                times[name].append(time.perf_counter() - t)
        cells = [f"{statistics.median(ts) * 1e3:.2f} ({nbytes / statistics.median(ts) / 1e9:.1f})" for ts in times.values()]
        print(f"| {m} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
