"""The MLP's activation pass (``impl/kernels/cpu_fused/activation.h``: gelu_tanh(gate) * up) beside ATen's two ops,
at E2B's prefill shape, in one run: ``python -m bench.investigations.activation_pass [--rows 256] [--inter 6144]``.

One call's shape is a 256-row MLP block of a 1024-token prefill ([256, 6144] gate and up rows); 60 calls are one
prefill's self-decoder (15 layers x 4 blocks). Prints the fastest of 5 rounds of 60 calls for bf16 and float32 rows,
ATen's ``gelu(g, approximate="tanh") * u`` on the same rows, and how many outputs differ from ATen's. Two builds are
compared by running it in a checkout of each (``git worktree add``): each builds its own extension. The allocator
keeps freed memory as the engine's does (``keep_freed_memory``), so no call pays page faults for its output.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.machine import cpu_description


def _best_ms(fn, calls: int, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--inter", type=int, default=6144)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if min(args.rows, args.inter, args.calls, args.threads) < 1:
        ap.error("--rows, --inter, --calls and --threads must be at least 1")

    from impl.engine.allocator import keep_freed_memory
    from impl.kernels import cpu_fused

    keep_freed_memory()  # as the engine runs: freed outputs reused, not page-faulted in again on every call
    ext = cpu_fused.load()
    if ext is None:
        raise SystemExit(f"the fused CPU kernels are unavailable: {cpu_fused.error()}")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"activation pass, {args.calls} calls on [{args.rows}, {args.inter}] rows, {args.threads} threads; "
          f"CPU: {cpu_description()}")
    for dtype in (torch.bfloat16, torch.float32):
        g = (torch.randn(args.rows, args.inter, generator=gen) * 2).to(dtype)
        u = torch.randn(args.rows, args.inter, generator=gen).to(dtype)
        ours = _best_ms(lambda: ext.gelu_mul(g, u), args.calls)
        aten = _best_ms(lambda: torch.nn.functional.gelu(g, approximate="tanh") * u, args.calls)
        differ = (ext.gelu_mul(g, u) != torch.nn.functional.gelu(g, approximate="tanh") * u).float().mean().item()
        print(f"{str(dtype).replace('torch.', ''):>9}: ours {ours:6.1f} ms, ATen {aten:6.1f} ms "
              f"(ours / ATen {ours / aten:.2f}); outputs that differ from ATen's: {differ:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
