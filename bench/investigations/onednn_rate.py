"""oneDNN's bf16 matmul rate at one shape, and the cost of the MLP's post-ops (bench/investigations/amx_bf16_gemm.cpp's
other half): ``python -m bench.investigations.onednn_rate [M K N]``. Prints TFLOP/s for the plain product, with GELU-tanh as
a post-op, with the gating multiply as a binary post-op, and E2B's MLP (gate, up, down) with those post-ops on 256-row
blocks (as decoder_post ran it before its activation pass, impl/kernels/cpu_fused/activation.h)."""

from __future__ import annotations

import argparse

import torch

from bench.machine import cpu_description, min_seconds


def _best(fn, flops: float, reps: int = 8) -> str:
    best = min_seconds(fn, reps)
    return f"{best * 1e3:7.2f} ms {flops / best / 1e12:5.2f} TFLOP/s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="*", type=int, default=[1024, 1536, 6144], help="M K N (E2B's gate shape)")
    args = ap.parse_args(argv)
    if len(args.shape) != 3:
        ap.error("give the shape as three numbers, M K N")
    m, k, n = args.shape
    torch.manual_seed(0)
    lin = torch.ops.mkldnn._linear_pointwise
    x = torch.randn(m, k).bfloat16()
    gate, up, down = ((torch.randn(*s) * 0.05).bfloat16() for s in ((n, k), (n, k), (k, n)))
    gp, up_p, dp = (torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in (gate, up, down))
    g = lin(x, gp, None, "gelu", [], "tanh")
    h = torch.randn(m, n).bfloat16()
    f = 2 * m * k * n
    print(f"oneDNN bf16, {torch.get_num_threads()} threads, [{m} x {k}] x [{k} x {n}]; CPU: {cpu_description()}")
    print("plain          ", _best(lambda: lin(x, gp, None, "none", [], ""), f))
    print("GELU-tanh post ", _best(lambda: lin(x, gp, None, "gelu", [], "tanh"), f))
    print("mul post       ", _best(lambda: lin.binary(x, g, up_p, None, "mul"), f))
    print("down (K <-> N) ", _best(lambda: lin(h, dp, None, "none", [], ""), f))

    def mlp() -> None:  # the MLP on 256-row blocks with the post-ops
        for lo in range(0, m, 256):
            xb = x[lo:lo + 256]
            y = lin.binary(xb, lin(xb, gp, None, "gelu", [], "tanh"), up_p, None, "mul")
            lin(y, dp, None, "none", [], "")

    print("MLP, post-ops  ", _best(mlp, 3 * f))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
