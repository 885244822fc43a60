"""Rotary position embeddings: "default" (sliding layers) and "proportional" (full layers).

Proportional RoPE with head dim D and partial factor f rotates only the first
``int(f * D) // 2`` frequency pairs: frequency ``j`` is ``theta^(-2j/D)`` (the
exponent is over the full D, not over the rotated part) and the remaining pairs
get frequency 0, i.e. the identity. Pairs are neox-style halves: dim ``i`` with
dim ``i + D/2``.
"""

from __future__ import annotations

import torch

from impl.config.model_config import RopeSpec
from impl.kernels.functional import apply_rope_prepared

__all__ = ["apply_rope", "apply_rope_prepared", "prepare_rope", "rope_cos_sin", "rope_inv_freq"]


def rope_inv_freq(spec: RopeSpec, head_dim: int) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` float32 (zeros for the non-rotated pairs)."""
    half = head_dim // 2
    if spec.rope_type == "proportional":
        rotated = int(spec.partial_rotary_factor * head_dim // 2)
    elif spec.rope_type == "default":
        rotated = half
    else:
        raise ValueError(f"RoPE type {spec.rope_type!r} is not supported; Gemma-4 uses 'default' and 'proportional'.")
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / head_dim
    inv = 1.0 / (spec.theta**exponents)
    return torch.cat([inv, torch.zeros(half - rotated, dtype=torch.float32)])


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> cos, sin [T, head_dim] (frequencies repeated for both halves)."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]  # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, D]. Neox-style: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    return apply_rope_prepared(x, *prepare_rope(cos, sin))


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, D] -> cos [T, 1, D] and sin [T, 1, D] with its first half negated, once per pass
    (every layer of a type reuses them; saves the negation and broadcasts per layer)."""
    d = sin.shape[-1] // 2
    return cos[:, None, :], torch.cat([-sin[:, :d], sin[:, d:]], dim=-1)[:, None, :]
