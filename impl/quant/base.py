"""The quantized weight formats: their names, their packed layout, and the scheme a model is served with.

The packed layout (``impl/kernels/cpu_fused/quant_linear.h`` reads it; this module and ``pack.py`` write it):
one contiguous tensor ``[N, G, B]`` per weight ``[N, K]``: each output row holds G groups of ``g = K / G``
inputs, each group one block of B bytes, its codes first, its float32 scales after them.

* ``w8a8``: int8 tensor, G = 1, B = K + 4: int8 codes q then scale s, w = q * s (per channel, symmetric);
  the activations are quantized per row (token) at run time, symmetric int8, and the dot products are exact
  integers. On a CPU with AMX-int8 the CPU transform rearranges these bytes in place into tile order
  (``[N / 32, 1, 32 K + 128]``, ``quant_linear.h``) for the kernels; the loaders always write this layout.
* ``w8a16``: uint8 tensor, B = g + 4: int8 codes (as bytes) then s, w = q * s (per channel: G = 1).
* ``w4a16``: uint8 tensor, B = g / 2 + 8: byte j < g / 2 holds code j in its low nibble and code j + g / 2 in
  its high nibble (0..15), then s and z (float32): w = (q - z) * s (symmetric formats store z = 8).
* ``w4a8``: int8 tensor with ``w4a16``'s bytes; the activations are quantized per row and per group of g inputs
  at run time (symmetric int8, as llama.cpp's Q4_0 x Q8_0 dot product does) and each group's dot product of
  codes is an exact integer: the kernel reads the same bytes as ``w4a16`` with about a third of its
  instructions per weight.

Invariants: g is a multiple of ``GROUP_MULTIPLE``; a weight whose K does not allow that keeps its float
dtype (and the startup log says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("w8a8", "w8a16", "w4a16", "w4a8")
INT4_KINDS = ("w4a16", "w4a8")
GROUP_MULTIPLE = 32  # quant_linear.cpp: kGroupMultiple
INT4_GROUPS = (32, 64, 128, 256)


@dataclass(frozen=True)
class WeightFormat:
    """One quantized format: its kind and (int4) group size."""

    kind: str  # one of KINDS
    group_size: int = 0  # inputs per scale (int4); 0: per output channel
    symmetric: bool = True  # int4: zero point 8 (symmetric) or per group (asymmetric)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown weight format {self.kind!r}; known: {', '.join(KINDS)}")
        if self.kind in INT4_KINDS and self.group_size not in INT4_GROUPS:
            raise ValueError(f"int4 weights take a group size of {', '.join(map(str, INT4_GROUPS))}, got {self.group_size}")

    @property
    def bits(self) -> int:
        return 4 if self.kind in INT4_KINDS else 8

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.int8 if self.kind in ("w8a8", "w4a8") else torch.uint8

    def name(self) -> str:
        if self.kind in INT4_KINDS:
            acts = ", int8 activations per group" if self.kind == "w4a8" else ""
            return (f"{self.kind} (int4, groups of {self.group_size}, {'symmetric' if self.symmetric else 'asymmetric'}"
                    f"{acts})")
        return {"w8a8": "w8a8 (int8 weights per channel, int8 activations per token)",
                "w8a16": "w8a16 (int8 weights per channel)"}[self.kind]

    def groups(self, k: int) -> int:
        return 1 if self.kind not in INT4_KINDS else k // self.group_size

    def applies_to(self, k: int) -> bool:
        """True when a weight with K = ``k`` inputs can take this format."""
        g = k if self.kind not in INT4_KINDS else self.group_size
        return k > 0 and k % g == 0 and g % GROUP_MULTIPLE == 0

    def packed_shape(self, n: int, k: int) -> tuple[int, int, int]:
        groups = self.groups(k)
        g = k // groups
        block = g + 4 if self.bits == 8 else g // 2 + 8
        return (n, groups, block)

    def packed_bytes(self, n: int, k: int) -> int:
        a, b, c = self.packed_shape(n, k)
        return a * b * c


LM_HEAD_FORMAT = WeightFormat("w8a16")  # the LM head's copy: int8 weights, float activations (logits stay precise)


@dataclass(frozen=True)
class QuantScheme:
    """How a model's weights are served: the format of the decoder linears and where it came from."""

    fmt: WeightFormat
    source: str  # e.g. "--torchao-config int4wo-128", "checkpoint (compressed-tensors)"
    prequantized: bool  # the checkpoint holds the codes (else: quantized while loading)
    lm_head: WeightFormat | None = LM_HEAD_FORMAT  # None: the LM head keeps the float embedding
    # the KV-shared layers' format where it differs (--torchao-config-kv-shared; None: fmt): with fast prefill
    # those layers run on a few rows per prompt, so their weights' bytes per decode step matter more than their
    # matmuls' rate
    kv_shared: WeightFormat | None = None

    def describe(self) -> str:
        head = f"; LM head {self.lm_head.kind}" if self.lm_head is not None else "; LM head float"
        shared = f"; KV-shared layers {self.kv_shared.name()}" if self.kv_shared is not None else ""
        return f"{self.fmt.name()} from {self.source}{shared}{head}"


def format_of(w: torch.Tensor, k: int) -> WeightFormat | None:
    """The format of packed weight ``w`` for K = ``k`` inputs (None: a float weight)."""
    if w.dim() != 3 or w.dtype not in (torch.int8, torch.uint8):
        return None
    groups, block = w.shape[1], w.shape[2]
    g = k // groups
    if w.dtype == torch.int8:
        return WeightFormat("w4a8", g) if block == g // 2 + 8 else WeightFormat("w8a8")
    if block == g + 4:
        return WeightFormat("w8a16")
    return WeightFormat("w4a16", g)
