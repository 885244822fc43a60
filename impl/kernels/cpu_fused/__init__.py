"""Fused CPU kernels for one decoder layer (float32 or bfloat16 weights), a C++ extension built on first use.

Why: on a CPU every ATen op costs microseconds of dispatch, allocation and iterator setup, and a
decode step of the tiny Gemma-4 runs about 45 of them per layer on ``[batch, 64]`` tensors (a
TorchScript'd layer body is only 10% faster, so the cost is in ATen, not in Python). Two kernels
replace them: ``attn_pre`` (input RMSNorm, fused q/k/v projection, head norms, RoPE) and
``decoder_post`` (o_proj, post-attention norm and residual, MLP, PLE gate, layer scalar). The
matmuls go to oneDNN or ATen's mm as ``linear.py`` plans (the MLP's GELU and gating multiply run as one
vector pass over their products, ``activation.h``); the row-local work runs as plain loops on ATen's OpenMP pool.

``reference.py`` holds the same computation in torch (the eager model path); the unit tests compare
the two. Results match to float32 rounding (the sum of squares in RMSNorm is accumulated in a
different order), not bit for bit.

Building needs a C++ compiler and ninja (``pip install ninja``). ``load()`` returns None, after
one warning, when either is missing or the build fails, and the model keeps its torch path;
``IMPL_CPU_FUSED=0`` turns the kernels off. The build lands in torch's extension cache
(``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) under a name that hashes the
source, flags, CPU and torch version, so ``-march=native`` code never runs on another CPU.
"""

from __future__ import annotations

import logging
import os

import torch

from impl.envs import envs
from impl.kernels.cpp_build import LazyExtension

logger = logging.getLogger("impl.kernels")

ENV_SWITCH = envs.IMPL_CPU_FUSED.name
_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = [os.path.join(_HERE, "fused_layer.cpp"), os.path.join(_HERE, "linear.cpp"),
            os.path.join(_HERE, "quant_linear.cpp"), os.path.join(_HERE, "quant_pack.cpp"),
            os.path.join(_HERE, "packed_dot.cpp")]

# -ffp-contract=off: no FMA may fuse a product into an add (RoPE's x*cos + rot*sin rounds both products;
# linear.cpp spells its FMAs out).
# -march=native: or IMPL_CPU_MARCH (e.g. haswell: the AVX2 code on an AVX-512 machine; cpp_build.march).
_CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]

EXTENSION = LazyExtension("impl_cpu_fused", _SOURCES, _CFLAGS, envs.IMPL_CPU_FUSED, "fused CPU kernels", "decoder layers use the torch path")
enabled_by_env = EXTENSION.enabled_by_env
load = EXTENSION.load
error = EXTENSION.error


WEIGHT_DTYPES = (torch.float32, torch.bfloat16)
QUANT_DTYPES = (torch.int8, torch.uint8)  # packed quantized weights [N, G, B] (quant_linear.h, impl/quant/base.py)


def is_quantized(w: torch.Tensor) -> bool:
    return w.dim() == 3 and w.dtype in QUANT_DTYPES


def usable_for(*tensors: torch.Tensor) -> bool:
    """True when the fused kernels can serve these weights: on CPU, all float32, all bfloat16, or all quantized
    in one packed dtype."""
    if not tensors or not all(t.device.type == "cpu" and t.dtype == tensors[0].dtype for t in tensors):
        return False
    if tensors[0].dtype in QUANT_DTYPES:
        return all(is_quantized(t) and t.is_contiguous() for t in tensors)
    return tensors[0].dtype in WEIGHT_DTYPES
