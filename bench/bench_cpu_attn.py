"""The triton backend's kernel providers on one extend and one decode batch, side by side (not a test).

Shapes are Gemma-4 E2B's attention: 8 query heads / 1 KV head, head_dim 256 with a 512-key sliding
window and head_dim 512 full; one request of ``--tokens`` new tokens (no prefix) for extend, and a
decode step of ``--decode-batch`` requests over ``--tokens`` keys each. KV slots are scattered over
the pool, as the engine's allocator leaves them after some traffic. Providers: the compiled CPU
kernels (``impl/kernels/cpu_attn``), the Triton kernels under the interpreter, and the torch
reference (``impl/kernels/reference.py``), all on the same metadata; runs alternate between
providers, median per provider.

``--decode-steps N``: also N decode steps in a row, each request one key longer than at the step before, with
the compiled kernels keeping their AMX packings across the steps (``kv_generation``, as the engine's decode does)
and packing every step (0): the mean step of each, the same bits.

Usage: ``python -m bench.bench_cpu_attn [--tokens 1024 --threads 1 --reps 3 --decode-steps 40]``.
"""

from __future__ import annotations

import argparse
import statistics
import time


import impl.kernels.triton_env  # noqa: F401  (interpreter on CPU before triton is imported)

import torch


def make_batch(q_lens, seq_lens, heads, kv_heads, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(seq_lens)
    capacity = total + 64
    slots = torch.randperm(capacity - 1, generator=g)[:total] + 1
    k = torch.randn(capacity, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(capacity, kv_heads, head_dim, generator=g).to(dtype)
    q = (torch.randn(sum(q_lens), heads, head_dim, generator=g) * head_dim**-0.5).to(dtype)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    kv = torch.tensor([0] + torch.tensor(seq_lens).cumsum(0).tolist(), dtype=torch.int32)
    pos = torch.cat([torch.arange(s - n, s) for n, s in zip(q_lens, seq_lens)])
    return q, k, v, qo, pos, kv, slots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--skip-interpreter", action="store_true")
    ap.add_argument("--skip-reference", action="store_true", help="time the CPU kernels only (the reference takes "
                    "seconds per launch at 8192 tokens); the table then gives each launch's TFLOP/s")
    ap.add_argument("--decode-steps", type=int, default=0, help="also time N growing decode steps, packings kept or not")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    from impl.attention.triton_providers import CPU_SPLIT_POLICY
    from impl.kernels import cpu_attn
    from impl.kernels.decode_attention import decode_attention_fwd, num_kv_splits_for
    from impl.kernels.extend_attention import extend_attention_fwd
    from impl.kernels.reference import attention_ref, decode_attention_ref

    if cpu_attn.load() is None:
        print(f"compiled CPU attention kernels unavailable: {cpu_attn.error()}")
        return 1
    n = args.tokens
    rows = []
    for head_dim, window, label in ((256, 512, "sliding (head_dim 256, window 512)"), (512, None, "full (head_dim 512)")):
        q, k, v, qo, pos, kv, slots = make_batch([n], [n], 8, 1, head_dim, dtype, seed=head_dim)
        ext = dict(
            cpu=lambda: cpu_attn.extend_attention_fwd(q, torch.empty_like(q), k, v, qo, pos, kv, slots, n, 1.0, window),
            interpreter=lambda: extend_attention_fwd(q, torch.empty_like(q), k, v, qo, pos, kv, slots, n, 1.0, window),
            reference=lambda: attention_ref(q, k, v, qo, pos, kv, slots, 1.0, window, compute_dtype=torch.float32),
        )
        b = args.decode_batch
        dq, dk, dv, _, dpos, dkv, dslots = make_batch([1] * b, [n] * b, 8, 1, head_dim, dtype, seed=head_dim + 1)
        splits = num_kv_splits_for([n] * b, 1, CPU_SPLIT_POLICY, args.threads)
        ns = torch.tensor(splits, dtype=torch.int32)
        one = torch.ones(b, dtype=torch.int32)
        dec = dict(
            cpu=lambda: cpu_attn.decode_attention_fwd(dq, torch.empty_like(dq), dk, dv, dpos, dkv, dslots, ns,
                                                      max(splits), 1.0, window),
            interpreter=lambda: decode_attention_fwd(dq, torch.empty_like(dq), dk, dv, dpos, dkv, dslots, one, 1, 1.0,
                                                     window),
            reference=lambda: decode_attention_ref(dq, dk, dv, dpos, dkv, dslots, 1.0, window,
                                                   compute_dtype=torch.float32),
        )
        # multiply-adds of Q K^T and P V (2 FLOPs each) over every visible (query head, key) pair
        seen = sum(min(i + 1, window or n) for i in range(n))
        heads = q.shape[1]
        flops = {"extend": 4 * heads * seen * head_dim, "decode": 4 * heads * b * min(n, window or n) * head_dim}
        for what, fns in ((f"extend {n} tokens, {label}", ext), (f"decode {b} x {n} keys, {label}", dec)):
            if args.skip_interpreter:
                fns.pop("interpreter")
            if args.skip_reference:
                fns.pop("reference")
            times = {name: [] for name in fns}
            for fn in fns.values():  # warm-up (first-call builds, interpreter caches)
                fn()
            for _ in range(args.reps):
                for name, fn in fns.items():
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
            med = {name: statistics.median(ts) for name, ts in times.items()}
            rows.append((what, med, flops[what.split()[0]]))
            print(what, {k2: round(v2 * 1e3, 2) for k2, v2 in med.items()}, "ms", flush=True)
    print()
    print(f"{args.dtype}, {args.threads} thread(s), median of {args.reps} alternating runs per provider")
    if args.skip_reference:
        print("| batch | CPU kernels (ms) | TFLOP/s |")
        print("|---|---:|---:|")
        for what, med, flops in rows:
            print(f"| {what} | {med['cpu'] * 1e3:.2f} | {flops / med['cpu'] / 1e12:.2f} |")
    else:
        print("| batch | CPU kernels (ms) | interpreter (ms) | torch reference (ms) | interpreter / CPU | reference / CPU |")
        print("|---|---:|---:|---:|---:|---:|")
        for what, med, _ in rows:
            c = med["cpu"]
            it = med.get("interpreter")
            print(f"| {what} | {c * 1e3:.1f} | {'-' if it is None else f'{it * 1e3:.0f}'} | {med['reference'] * 1e3:.1f} "
                  f"| {'-' if it is None else f'{it / c:.0f}x'} | {med['reference'] / c:.1f}x |")
    if args.decode_steps:
        decode_steps(cpu_attn, args, dtype)
    return 0


def decode_steps(cpu_attn, args, dtype) -> None:
    """--decode-steps: mean time of a decode step over --decode-batch requests growing from --tokens keys, the
    compiled kernels keeping their packings across steps or not (alternating runs, median per mode)."""
    b, n, steps = args.decode_batch, args.tokens, args.decode_steps
    generations = iter(range(1 << 41, 1 << 42))  # generations of its own: nothing kept elsewhere matches
    print()
    print(f"{dtype}, {args.threads} thread(s), {steps} decode steps of {b} requests from {n} keys each, "
          f"median of {args.reps} alternating runs")
    print("| decode step | packings kept (ms) | packed every step (ms) | kept / every step | same bits |")
    print("|---|---:|---:|---:|---|")
    for head_dim, window, label in ((256, 512, "sliding (head_dim 256, window 512)"), (512, None, "full (head_dim 512)")):
        q, k, v, _, _, kv, slots = make_batch([1] * b, [n + steps] * b, 8, 1, head_dim, dtype, seed=head_dim + 2)
        base = kv.tolist()
        ones = torch.ones(b, dtype=torch.int32)

        def run(generation: int) -> list[torch.Tensor]:
            outs = []
            for t in range(steps):
                idx = torch.cat([slots[base[r]: base[r] + n + t] for r in range(b)])
                kvp = torch.arange(0, (b + 1) * (n + t), n + t, dtype=torch.int32)
                pos = torch.full((b,), n + t - 1)
                outs.append(cpu_attn.decode_attention_fwd(q, torch.empty_like(q), k, v, pos, kvp, idx, ones, 1, 1.0,
                                                          window, kv_generation=generation))
            return outs

        times: dict[str, list[float]] = {"kept": [], "every": []}
        same = True
        ref = run(0)
        for _ in range(args.reps):
            for mode in times:
                t0 = time.perf_counter()
                got = run(next(generations) if mode == "kept" else 0)
                times[mode].append((time.perf_counter() - t0) / steps)
                same = same and all(torch.equal(a, r) for a, r in zip(got, ref))
        kept, every = statistics.median(times["kept"]), statistics.median(times["every"])
        print(f"| {b} x {n}+ keys, {label} | {kept * 1e3:.2f} | {every * 1e3:.2f} | {kept / every:.2f}x | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    raise SystemExit(main())
