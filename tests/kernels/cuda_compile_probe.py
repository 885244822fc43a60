"""Compile the attention kernels for an sm_90 GPU without one (run as a subprocess).

Triton's CUDA backend (ptxas ships with triton) compiles ahead of time on a CPU
box; this catches errors the interpreter accepts (loop-carried type changes,
non-constexpr globals, tl.dot shape limits) and prints each kernel's shared
memory so the test can hold it under the H100/H200 limit. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch

torch.cuda.is_available = lambda: True  # noqa: E731  (compile, never launch: kernels must be JITFunctions)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import impl.kernels.decode_attention as da  # noqa: E402
import impl.kernels.extend_attention as ea  # noqa: E402
from impl.kernels.launch_config import block_d, decode_launch, extend_launch  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
TL = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_shared(fn, args: dict, consts: dict, num_warps: int, num_stages: int) -> int:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        else:
            sig[name] = args[name]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages}).metadata.shared


def default_type(name: str, dt: str) -> str:
    if name in ("Q", "K_buf", "V_buf", "O"):
        return f"*{dt}"
    if name in ("Mid_O", "Mid_LSE"):
        return "*fp32"
    if name in ("qo_indptr", "q_positions", "kv_indptr", "kv_indices", "num_kv_splits"):
        return "*i32"
    if name in ("sm_scale", "logit_cap"):
        return "fp32"
    return "i32"  # window, strides


def main(cases: list[tuple[torch.dtype, int]]) -> None:
    kernels = (ea._extend_attn_kernel, da._decode_stage1_kernel, da._decode_stage2_kernel)
    out = []
    for i, (dtype, d) in enumerate(cases):
        types = {n: default_type(n, TL[dtype]) for fn in kernels for n in fn.arg_names}
        e = extend_launch(d, dtype, interpreted=False)
        c = decode_launch(d, 8, dtype, interpreted=False)
        ext = dec = 0
        # every case with window and cap; the first also without (other constexpr branches)
        for flags in ((True, True), (False, False)) if i == 0 else ((True, True),):
            common = dict(HEAD_DIM=d, BLOCK_D=block_d(d), HAS_WINDOW=flags[0], HAS_CAP=flags[1], UPCAST_DOT=False,
                          DOT_IEEE=dtype == torch.float32)
            ext = max(ext, compile_shared(kernels[0], types, dict(common, KV_GROUP=8, ROWS_PER_BLOCK=e.block_m // 8,
                                                                  BLOCK_M=e.block_m, BLOCK_N=e.block_n),
                                          e.num_warps, e.num_stages))
            dec = max(dec, compile_shared(kernels[1], types, dict(common, KV_GROUP=8, BLOCK_H=c.block_h,
                                                                  BLOCK_N=c.block_n, DIRECT_OUT=flags[0]),
                                          c.num_warps, c.num_stages))
        red = compile_shared(kernels[2], types, dict(HEAD_DIM=d, BLOCK_D=block_d(d)), 4, 1)
        out.append({"dtype": TL[dtype], "head_dim": d, "extend": ext, "decode": dec, "reduce": red})
    print(json.dumps(out))

if __name__ == "__main__":
    # args like bf16:80 fp32:512 (default: every dtype x 64, 80, 256, 512)
    names = {v: k for k, v in TL.items()}
    args = sys.argv[1:] or [f"{t}:{d}" for t in TL.values() for d in (64, 80, 256, 512)]
    main([(names[a.split(":")[0]], int(a.split(":")[1])) for a in args])
