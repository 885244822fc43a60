"""A bf16 model through the compiled CPU paths against the machine's limits, measured in the same run (not a test).

llama-bench style figures at batch 1 on a bf16 checkpoint served in bf16 (``--dtype bfloat16``, triton
prefill with ``--kv-sharing-fast-prefill``, torch_native decode), once per linear mode (``IMPL_CPU_LINEAR``;
one engine at a time):

* ``pp<N>``: prompt tokens per second of a fresh N-token prompt (time to the first token, one new token);
  its bound = the float32 GEMM rate at the layer shapes / the FLOPs a prompt token needs with the flag
  (the self-decoder layers on every row, the KV-shared layers on the last row: ``bench_yoco.prefill_flops``);
* ``tg<N>``: decode tokens per second of N new tokens after a 16-token prompt ((N - 1) / decode time);
  its bound = the memory read bandwidth / the bytes of weights one step reads (every decoder-layer weight,
  the per-layer-input projection and the LM head; embedding rows are gathered).

The limits: float32 GEMM rate at the E2B layer shapes over 1024 rows (the better of ATen mm and prepacked
oneDNN, FLOP-weighted over q/k/v, o, gate+up and down), and the read bandwidth of a float32 sum over
512 MB (the copy bandwidth, bytes read + written, is printed too).

Usage: ``python -m bench.bench_cpu_bf16 [--model e2b-dims] [--modes auto,onednn,mkl] [--pp 512,1024] [--tg 64]``
(``make bench-cpu-bf16``). Needs the checkpoint's bf16 size in free memory (``e2b-dims``: 3.7 GB).
For the AVX2 paths on an AVX-512 machine: ``ONEDNN_MAX_CPU_ISA=AVX2 IMPL_CPU_MARCH=haswell``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.bench_yoco import prefill_flops
from bench.machine import cpu_description, min_seconds


def gemm_rate(cfg, rows: int = 1024, reps: int = 3) -> dict[str, float]:
    """float32 GFLOP/s at the layer shapes: ATen mm and prepacked oneDNN (FLOP-weighted over the shapes)."""
    from impl.kernels.cpu_fused import linear as cpu_linear

    h, heads = cfg.hidden_size, cfg.num_attention_heads
    d, kv = cfg.layer_head_dims[0], cfg.layer_num_kv_heads[0]
    shapes = [((heads + 2 * kv) * d, h), (h, heads * d), (2 * cfg.intermediate_size, h), (h, cfg.intermediate_size)]
    lin = torch.ops.mkldnn._linear_pointwise
    out = {}
    for name in ("mm", "onednn"):
        if name == "onednn" and not cpu_linear.onednn_available():
            continue
        flops = secs = 0.0
        for n, k in shapes:
            x, w = torch.randn(rows, k), torch.randn(n, k)
            f = (lambda: torch.mm(x, w.t())) if name == "mm" else (lambda p=cpu_linear.pack(w): lin(x, p, None, "none", [], ""))
            secs += min_seconds(f, reps)
            flops += 2.0 * rows * n * k
        out[name] = flops / secs / 1e9
    return out


def bandwidth(reps: int = 5) -> tuple[float, float]:
    """(read GB/s of a float32 sum over 512 MB, copy GB/s counting bytes read + written)."""
    a = torch.ones(128 << 20)
    b = torch.empty_like(a)
    read = copy = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        a.sum()
        read = max(read, a.numel() * 4 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        b.copy_(a)
        copy = max(copy, 2 * a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return read, copy


def decode_bytes(model, packed_bytes: int) -> int:
    """Bytes of weights one batch-1 decode step reads: the decoder layers' linear weights as they are held
    (plain bf16, or the prepacked copies that replaced them: ``packed_bytes``), the per-layer-input
    projection and the LM head. Embedding rows are gathered, norms are negligible."""
    total = packed_bytes
    for name, p in model.named_parameters():
        if p.is_meta:  # replaced by a prepacked copy (counted above)
            continue
        layer_linear = name.startswith("layers.") and name.endswith(("proj.weight", "input_gate.weight", "per_layer_projection.weight"))
        if layer_linear or name == "per_layer_model_projection.weight":
            total += p.numel() * p.element_size()
    w = model.lm_head_weight()
    return total + w.numel() * w.element_size()


def run_mode(args, path: str, mode: str, limits: dict) -> dict:
    from impl import Engine

    if mode == "auto":
        os.environ.pop("IMPL_CPU_LINEAR", None)
    else:
        os.environ["IMPL_CPU_LINEAR"] = mode
    pps = [int(x) for x in args.pp.split(",") if x]
    eng = Engine(model_path=path, dtype="bfloat16", attention_backend="triton", decode_attention_backend="torch_native",
                 kv_sharing_fast_prefill=True, disable_radix_cache=True, random_seed=0,
                 max_total_tokens=max(pps + [16]) + args.tg + 64)
    try:
        cfg = eng.model_config
        kernels = next((ln for ln in eng.startup_log if "CPU kernels:" in ln), "")
        g = torch.Generator().manual_seed(args.seed)
        prompt = lambda n: torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist()  # noqa: E731
        eng.generate(input_ids=prompt(64), sampling_params={"max_new_tokens": 2, "temperature": 0.0})  # warm-up
        row: dict = {"mode": mode, "kernels": kernels.split("CPU kernels: ", 1)[-1]}
        for n in pps:
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                eng.generate(input_ids=prompt(n), sampling_params={"max_new_tokens": 1, "temperature": 0.0})
                times.append(time.perf_counter() - t)
            tps = n / statistics.median(times)
            bound = limits["gemm"] * 1e9 / (prefill_flops(cfg, n, fast=True) / n)
            row[f"pp{n}"] = (tps, tps / bound)
        rates = []
        for _ in range(args.reps):
            out = eng.generate(input_ids=prompt(16), sampling_params={"max_new_tokens": args.tg, "temperature": 0.0,
                                                                       "ignore_eos": True})
            meta = out["meta_info"]
            rates.append((args.tg - 1) / (meta["e2e_latency"] - meta["ttft"]))
        tps = statistics.median(rates)
        step_bytes = decode_bytes(eng.runner.model, eng.runner.cpu_kernels.packed_bytes)
        bound = limits["read"] * 1e9 / step_bytes
        row[f"tg{args.tg}"] = (tps, tps / bound)
        row["step_gb"] = step_bytes / 1e9
        return row
    finally:
        eng.shutdown()
        del eng


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="e2b-dims")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="auto,onednn,mkl", help="IMPL_CPU_LINEAR values, one engine each")
    ap.add_argument("--pp", default="512,1024")
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl.config.model_config import ModelConfig
    from impl.kernels.cpu_fused import linear as cpu_linear
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    cfg = ModelConfig.from_pretrained(path)
    rates = gemm_rate(cfg)
    read, copy = bandwidth()
    limits = {"gemm": max(rates.values()), "read": read}
    print(f"{cpu_description()}; torch {torch.__version__}, {args.threads} threads; ONEDNN_MAX_CPU_ISA="
          f"{os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}, IMPL_CPU_MARCH={os.environ.get('IMPL_CPU_MARCH', '(native)')}; "
          f"native bf16: {cpu_linear.bf16_isa() or 'no'}")
    print(f"limits: float32 GEMM at the layer shapes {', '.join(f'{k} {v:.0f}' for k, v in rates.items())} GFLOP/s "
          f"(bound uses {limits['gemm']:.0f}); read bandwidth {read:.1f} GB/s (copy {copy:.1f} GB/s, read + written)")
    print(f"model {args.model}: {cfg.num_hidden_layers} layers ({cfg.num_kv_shared_layers} KV-shared), hidden "
          f"{cfg.hidden_size}, vocabulary {cfg.vocab_size}; bf16; prefill with --kv-sharing-fast-prefill")
    print()
    rows = [run_mode(args, path, m, limits) for m in args.modes.split(",") if m]
    pps = [f"pp{n}" for n in args.pp.split(",") if n]
    tg = f"tg{args.tg}"
    print("| linear mode | " + " | ".join(f"{k} tok/s (of bound)" for k in pps + [tg]) + " | weights per step (GB) |")
    print("|---|" + "---:|" * (len(pps) + 2))
    for r in rows:
        cells = [f"{r[k][0]:.1f} ({r[k][1]:.0%})" for k in pps + [tg]]
        print(f"| {r['mode']} | " + " | ".join(cells) + f" | {r['step_gb']:.2f} |")
    print()
    for r in rows:
        print(f"- {r['mode']}: {r['kernels']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
