"""The lossy settings ``bench/accuracy.py`` measures: each one a reference and a candidate, both plain server
arguments (what ``python -m impl.launch_server`` takes), so a new format is one entry here.

A setting changes one thing against its reference: the KV settings keep float32 weights and compare the KV
storage alone; the weight settings keep the default (auto) KV dtype. ``COMMON`` goes on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

# Both sides of every setting: no prefix cache (every request computes its own prefix the same way), seeded.
COMMON: tuple[str, ...] = ("--disable-radix-cache", "--random-seed", "0")


@dataclass(frozen=True)
class Setting:
    """A lossy candidate measured against its reference (server argument lists, ``COMMON`` added)."""

    name: str
    reference: tuple[str, ...]
    candidate: tuple[str, ...]
    what: str  # one line for the table: what is lossy

    def argv(self, side: str, model_path: str) -> list[str]:
        """The full server argv of ``side`` ("reference" or "candidate") on ``model_path``."""
        extra = self.reference if side == "reference" else self.candidate
        return ["--model-path", model_path, *COMMON, *extra]


F32 = ("--dtype", "float32")
BF16 = ("--dtype", "bfloat16")

SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("kv-fp8_e4m3", (*F32, "--kv-cache-dtype", "bf16"), (*F32, "--kv-cache-dtype", "fp8_e4m3"),
            "fp8 e4m3 KV (scale 1.0) vs bf16 KV, float32 weights"),
    Setting("kv-fp8_e5m2", (*F32, "--kv-cache-dtype", "bf16"), (*F32, "--kv-cache-dtype", "fp8_e5m2"),
            "fp8 e5m2 KV (scale 1.0) vs bf16 KV, float32 weights"),
    Setting("weights-bf16", F32, BF16, "bf16 weights and activations vs float32"),
    # the quantized weight formats (impl/quant) against the checkpoint's float32 weights; groups of 32 for int4 (the
    # tiny checkpoints are 64 wide; at full size int4wo-128)
    Setting("weights-w8a8", F32, (*F32, "--torchao-config", "int8dq"),
            "int8 weights per channel and int8 activations per token (W8A8) vs float32"),
    Setting("weights-w8a16", F32, (*F32, "--torchao-config", "int8wo"), "int8 weights per channel (W8A16) vs float32"),
    Setting("weights-w4a16", F32, (*F32, "--torchao-config", "int4wo-32"),
            "int4 weights in groups of 32, asymmetric (W4A16) vs float32"),
    Setting("weights-w4a8", F32, (*F32, "--torchao-config", "8da4w-32"),
            "int4 weights in groups of 32, asymmetric, int8 activations per group (W4A8) vs float32"),
    # two formats in one model: W8A8, with W4A8 in the KV-shared layers (--torchao-config-kv-shared)
    Setting("weights-w8a8-shared-w4a8", F32, (*F32, "--torchao-config", "int8dq", "--torchao-config-kv-shared", "8da4w-32"),
            "W8A8, the KV-shared layers W4A8 (int4 in groups of 32, int8 activations per group) vs float32"),
)}

DEFAULT_SETTINGS = ("kv-fp8_e4m3", "kv-fp8_e5m2", "weights-bf16", "weights-w8a8", "weights-w8a16", "weights-w4a16",
                    "weights-w4a8", "weights-w8a8-shared-w4a8")
