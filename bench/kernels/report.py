"""Print achieved TFLOP/s and GB/s of our attention kernels next to torch SDPA (used by scripts/gpu_check.sh).

Also checks each result against SDPA (where SDPA applies) so a fast wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import torch

from bench.kernels import attn_bench as ab


def main() -> None:
    print(f"device: {torch.cuda.get_device_name() if ab.CUDA else 'cpu (Triton interpreter: numbers are not meaningful)'}")
    print(f"{'shape':28s} {'ours ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} | {'sdpa ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s}  max|diff|")
    iters = 20 if ab.CUDA else 1
    for s in ab.shapes():
        p = ab.Problem(s)
        f, b = ab.flops(s), ab.min_bytes(s)
        ms = ab.time_ms(p.ours, warmup=3 if ab.CUDA else 1, iters=iters)
        line = f"{s.name:28s} {ms:9.3f} {f / ms / 1e9:8.1f} {b / ms / 1e6:8.1f} |"
        ref = p.sdpa()
        if ref is None:
            line += f" {'-':>9s} {'-':>8s} {'-':>8s}  (no SDPA window path)"
        else:
            ms_ref = ab.time_ms(p.sdpa, warmup=3 if ab.CUDA else 1, iters=iters)
            ours = p.ours().view(s.batch, s.q_len, s.num_heads, s.head_dim).transpose(1, 2).float()
            diff = float((ours - ref.float()).abs().max())
            line += f" {ms_ref:9.3f} {f / ms_ref / 1e9:8.1f} {b / ms_ref / 1e6:8.1f}  {diff:.3g}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
