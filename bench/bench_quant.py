"""Quantized weights at E2B's full size, kernel level: one decode step's linear layers (35 decoder layers, the
per-layer-input projection, the LM head) and a prefill GEMM, bf16 against every quantized format, in one run.

Why kernel level: a decode step at E2B size is bound by the bytes of weights it reads (4.4 GB in bf16), and
those bytes are read by exactly these calls; timing them alone, with the machine's copy bandwidth measured
in the same run, says how close each format gets to its bound without a 9 GB checkpoint. (``make
bench-full`` / ``bench_full --server-args`` serve the formats end to end on ``e2b-full``.)

Weights are random (drawn per weight in bf16, then packed as the engine packs them at load: the same
bytes and the same kernels the engine runs); each format's set is built, timed and dropped in turn (peak
memory: one set, 4.4 GB for bf16). Times are the minimum over ``--reps`` repetitions (the machine is
shared: the minimum is the least disturbed run).

    python -m bench.bench_quant [--reps 5] [--threads 2] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import dataclass

import torch

from bench.machine import copy_bandwidth, cpu_description, min_seconds
from impl.kernels import cpu_fused
from impl.kernels.cpu_fused import linear as cpu_linear
from impl.quant.base import WeightFormat
from impl.quant.pack import pack

HIDDEN, LAYERS, SHARED, HEADS, PLE, VOCAB, INTER = 1536, 35, 20, 8, 256, 262144, 6144
FORMATS = {"bf16": None, "w8a8 (int8dq)": WeightFormat("w8a8"), "w8a16 (int8wo)": WeightFormat("w8a16"),
           "w4a16 (int4wo-128)": WeightFormat("w4a16", 128, symmetric=False),
           "w4a8 (8da4w-128)": WeightFormat("w4a8", 128, symmetric=False)}


def e2b_linears() -> list[tuple[int, int]]:
    """(N, K) of every linear one E2B decode step runs, in order (E2B: every 5th layer full attention with
    head_dim 512, else 256; the last 20 layers KV-shared with double-wide MLPs)."""
    out: list[tuple[int, int]] = [(LAYERS * PLE, HIDDEN)]  # per_layer_model_projection
    for i in range(LAYERS):
        d = 512 if i % 5 == 4 else 256
        shared = i >= LAYERS - SHARED
        inter = INTER * (2 if shared else 1)
        out += [((HEADS if shared else HEADS + 2) * d, HIDDEN), (HIDDEN, HEADS * d), (2 * inter, HIDDEN),
                (HIDDEN, inter), (PLE, HIDDEN), (HIDDEN, PLE)]
    out.append((VOCAB, HIDDEN))  # LM head (tied embedding; quantized formats read a w8a16 copy)
    return out


@dataclass
class Row:
    name: str
    weight_gb: float
    decode_ms: float  # one decode step's linears, batch 1
    decode4_ms: float  # batch 4
    prefill_gops: float  # a 512-row MLP GEMM pair


def _head(fmt: WeightFormat | None) -> WeightFormat | None:
    """The LM head's format beside ``fmt`` (impl/quant/config.py: W8A8 beside the activation-quantized formats)."""
    if fmt is None:
        return None
    return WeightFormat("w8a8") if fmt.kind in ("w8a8", "w4a8") else WeightFormat("w8a16")


def _weights(fmt: WeightFormat | None, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ws = []
    shapes = e2b_linears()
    plan = cpu_linear.plan(torch.bfloat16)
    ext = cpu_fused.load()
    for i, (n, k) in enumerate(shapes):
        w = (torch.randn(n, k, generator=g, dtype=torch.bfloat16) * 0.02)
        f = fmt if i < len(shapes) - 1 else _head(fmt)
        if f is not None:  # in tile order where the engine puts it so at load (quant_tile_order_: W8A8 / W4A8)
            w = ext.quant_tile_order_(pack(w, f), k)
        elif plan.mode == "packed" and i < len(shapes) - 1:
            w = cpu_linear.pack(w)
        ws.append(w)
    return ws


def run(reps: int) -> tuple[list[Row], float]:
    ext = cpu_fused.load()
    if ext is None:
        raise SystemExit(f"the fused CPU kernels are unavailable: {cpu_fused.error()}")
    onednn = cpu_linear.native_bf16()
    shapes = e2b_linears()
    rows = []
    bw = copy_bandwidth(reps) / 1e9
    for name, fmt in FORMATS.items():
        ws = _weights(fmt)
        gb = sum(w.numel() * w.element_size() if not w.is_mkldnn else w.numel() * 2 for w in ws) / 1e9
        xs = {k: torch.randn(4, k) for k in {k for _, k in shapes}}

        def step(m: int) -> None:
            for w, (_, k) in zip(ws, shapes):
                ext.linear(xs[k][:m], w, onednn)

        d1 = min_seconds(lambda: step(1), reps)
        d4 = min_seconds(lambda: step(4), reps)
        x = torch.randn(512, HIDDEN)
        gate_up, down = ws[-5], ws[-4]  # the last layer's MLP: [2 * 12288, 1536], [1536, 12288]
        y = torch.randn(512, down.shape[1] if down.dim() == 2 else 2 * INTER)
        t = min_seconds(lambda: (ext.linear(x, gate_up, onednn), ext.linear(y, down, onednn)), max(2, reps // 2))
        flops = 2 * 512 * (2 * 2 * INTER * HIDDEN + HIDDEN * 2 * INTER)
        rows.append(Row(name, gb, d1 * 1e3, d4 * 1e3, flops / t / 1e9))
        print(f"{name}: {gb:.2f} GB, decode step {d1 * 1e3:.1f} ms (batch 4 {d4 * 1e3:.1f} ms), prefill {flops / t / 1e9:.0f} GOP/s",
              flush=True)
        ws = []  # this format's set released before the next is built
        gc.collect()
    return rows, bw


def table(rows: list[Row], bw: float) -> str:
    base = rows[0]
    out = ["| weights | bytes per step | decode step (batch 1) | tok/s bound by these linears | vs bf16 | % of copy bandwidth | batch 4 step | prefill GEMM | vs bf16 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r.name} | {r.weight_gb:.2f} GB | {r.decode_ms:.1f} ms | {1e3 / r.decode_ms:.1f} | "
                   f"{base.decode_ms / r.decode_ms:.2f}x | {100 * r.weight_gb / (r.decode_ms / 1e3) / bw:.0f}% | "
                   f"{r.decode4_ms:.1f} ms | {r.prefill_gops:.0f} GOP/s | {r.prefill_gops / base.prefill_gops:.2f}x |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json-out")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows, bw = run(a.reps)
    print(f"\nCPU: {cpu_description()}; {a.threads} threads; copy bandwidth {bw:.1f} GB/s (measured in this run)\n")
    print(table(rows, bw))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"cpu": cpu_description(), "copy_gbps": bw, "rows": [r.__dict__ for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
