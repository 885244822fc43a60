"""No dtype round trips in the forward (issue 33, item 3): the ``aten::_to_copy`` calls of one prefill and one
decode step of the tiny ``e2b`` checkpoint (35 layers, 20 of them KV-shared) on the CPU path (fused decoder
layers, the triton backend's C++ attention kernels), counted with torch.profiler. A count above the bound
means a conversion came back (a per-layer ``.to(dtype)`` of a constant, a widening the kernel could
avoid); lower it when a conversion goes.

Counts per forward (200-token prefill / one decode step): at first -> after the first removals -> after the
kernels' bf16 rows and the one-pass per-layer inputs (both below):

| dtype | fast prefill | prefill | decode |
|---|---|---:|---:|
| bfloat16 | off | 452 -> 242 -> 64 | 452 -> 242 -> 64 |
| bfloat16 | on | 466 -> 261 -> 82 | 452 -> 242 -> 64 |
| float32 | off | 89 -> 19 | 89 -> 19 |
| float32 | on | 99 -> 29 | 89 -> 19 |

First removals, per layer: the attention kernels' int32 -> int64 copies of qo_indptr / kv_indptr (2, any
dtype), the RoPE cos / sin widened by ``attn_pre`` (2, bf16: now once per forward and layer type,
``transform.WidenOnce``), a KV-shared layer's empty k / v converted (2, bf16: now made in h's dtype).

Then the kernels' bf16 rows (fused_layer.cpp ``RowsIn`` / ``RowsOut``): ``attn_pre`` and ``decoder_post`` read
the bf16 residual ``h``, the per-layer inputs (a strided slice of the bf16 table: no widened table per forward
any more), oneDNN's bf16 matmul outputs and the bf16 attention output row by row, widening each row into a
per-thread scratch row, and write q / k / v, the MLP's bf16 input and the layer output rounded row by row, so
the whole-tensor conversions around every matmul and kernel are gone (bit-identical results: the same float32
loops on the same values). On a 1024-token E2B prefill that was ~20 conversion passes per layer (3.3 ms of a
33 ms ``decoder_post``, 2 ms of a 5.7 ms ``attn_pre``). And a bf16 model's per-layer inputs are one pass of
the extension (``transform.PleInputsKernel``) instead of ple.py's ops (the RMSNorm's float32 copy and back,
the projection's rounding: 7 fewer).

What remains per layer (bf16, about 1.5): the bf16 weights' row kernel (the tiny checkpoint's weights are
under oneDNN's size floor) takes float32 rows, so the bf16 attention output is widened for ``o_proj``. Per
forward: the positions widened for the RoPE angles, the cos / sin rounded to the model dtype (the reference's
tables) and widened once per layer type, ``rope_inv_freq`` per layer type, RMSNorm in float32 around the final
norm (as transformers computes it; its bf16 weight widened per call), and with fast prefill the
cross-decoder's own RoPE tables.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from impl.engine.engine import Engine
from impl.kernels.cpu_fused.transform import WidenOnce
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

PROMPT = [(i * 7) % 200 + 3 for i in range(200)]

# (dtype, fast prefill) -> the most aten::_to_copy calls (prefill forward, decode forward) may make
BOUNDS = {
    ("bfloat16", False): (64, 64),
    ("bfloat16", True): (82, 64),
    ("float32", False): (19, 19),
    ("float32", True): (29, 19),
}


def to_copy_per_forward(dtype: str, fast: bool) -> dict[str, int]:
    """aten::_to_copy calls of the prefill forward and of the first decode forward of one greedy request."""
    eng = Engine(tiny_checkpoint("e2b"), random_seed=0, dtype=dtype, disable_radix_cache=True,
                 kv_sharing_fast_prefill=fast)
    try:
        kernels = eng.runner.cpu_kernels
        if kernels is None or kernels.fused_layers < len(kernels.layer_paths):
            pytest.skip("the bounds are those of the fused CPU kernels (extension unavailable or IMPL_CPU_FUSED=0)")
        eng.generate(input_ids=PROMPT, sampling_params=dict(max_new_tokens=2, temperature=0))  # warm-up
        counts: dict[str, int] = {}
        forward = eng.runner.forward

        def profiled(fb):
            with profile(activities=[ProfilerActivity.CPU]) as p:
                out = forward(fb)
            phase = "decode" if fb.forward_mode.is_decode else "prefill"
            counts.setdefault(phase, sum(e.count for e in p.key_averages() if e.key == "aten::_to_copy"))
            return out

        eng.runner.forward = profiled
        eng.generate(input_ids=PROMPT, sampling_params=dict(max_new_tokens=2, temperature=0))
        return counts
    finally:
        eng.shutdown()


@pytest.mark.parametrize("dtype,fast", list(BOUNDS))
def test_to_copy_per_forward_does_not_grow(dtype, fast):
    counts = to_copy_per_forward(dtype, fast)
    prefill, decode = BOUNDS[(dtype, fast)]
    assert counts["prefill"] <= prefill, f"prefill forward: {counts['prefill']} aten::_to_copy, bound {prefill}"
    assert counts["decode"] <= decode, f"decode forward: {counts['decode']} aten::_to_copy, bound {decode}"


def test_widen_once_widens_each_table_once():
    """The fused layers' shared widening: a layer's slice of one bf16 table maps onto one float32 copy with
    the slice's strides and values; inference tensors (no version counter) are served too."""
    widen, fb = WidenOnce(), object()
    table = torch.randn(5, 3, 4).to(torch.bfloat16)  # [T, L, P]
    a, b = widen(table[:, 1], fb), widen(table[:, 2], fb)
    assert torch.equal(a, table[:, 1].float()) and torch.equal(b, table[:, 2].float())
    assert a.stride() == table[:, 1].stride()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    cos = torch.randn(5, 4).to(torch.bfloat16)
    assert torch.equal(widen(cos[:, None, :], fb), cos[:, None, :].float())
    with torch.inference_mode():
        x = torch.randn(4, 2).to(torch.bfloat16)
        assert torch.equal(widen(x[:, 1], object()), x[:, 1].float())
