"""The hybrid sliding-window KV pool (SGLang's SWAKVPool design, this engine's code) and its sizing.

Full-attention layers keep every token of a context; sliding-window layers only need the last
``sliding_window - 1`` tokens before a query. So the pool has two token budgets: full layers'
buffers hold ``capacity`` rows (the slots ``req_to_token`` names), sliding layers' buffers
``swa_capacity`` rows, ``--swa-full-tokens-ratio`` times as many (SGLang's default 0.8). Each
allocated token takes one slot of each, paired by the allocator's ``full_to_swa`` map
(``impl/cache/allocator.py:SWATokenSlotAllocator``); sliding layers read and write their rows through
it (``slot_map``). Tokens that left every sliding layer's window give their sliding-window slot back
while their full slot stays (``HybridSWAPool.release_out_of_window``, ``impl/engine/kv_pools.py``); the radix cache keeps such
prefixes as tombstones (``impl/cache/swa_radix_cache.py``). KV-shared layers own nothing, as before.

``--disable-hybrid-swa-memory`` (or a model without both layer types) keeps the one pool of
``impl/cache/kv_pool.py``.

Sizing (``hybrid_budget``), as SGLang's ``HybridSWAPoolConfigurator``: a memory budget
(``--mem-fraction-static``, ``impl/cache/memory.py``: the bytes one pool of ``N`` tokens would take) is
split so that ``full * full_bytes + ratio * full * swa_bytes == N * (full_bytes + swa_bytes)`` (bytes, not
layer counts: Gemma-4's full layers have twice the head dim of its sliding ones); ``--max-total-tokens N``
names the full-attention budget itself (``full = N``, ``swa = ratio * N``), as in SGLang. With
``--max-running-requests``, the radix cache off and chunked prefill, the sliding-window budget comes from the
requests instead (SGLang's request cap: ``impl/cache/swa_request_cap.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.cache.kv_pool import TokenToKVPool
from impl.cache.kv_quant import KVScales
from impl.config.model_config import ModelConfig


def hybrid_applies(model_config: ModelConfig, disable_hybrid_swa_memory: bool) -> bool:
    """The hybrid pool serves models whose KV-owning layers include both layer types."""
    if disable_hybrid_swa_memory or model_config.sliding_window is None:
        return False
    kinds = {model_config.is_sliding(i) for i in model_config.kv_layer_ids}
    return kinds == {True, False}


def swa_layer_ids(model_config: ModelConfig) -> tuple[int, ...]:
    return tuple(i for i in model_config.kv_layer_ids if model_config.is_sliding(i))


def full_layer_ids(model_config: ModelConfig) -> tuple[int, ...]:
    return tuple(i for i in model_config.kv_layer_ids if not model_config.is_sliding(i))


@dataclass(frozen=True)
class HybridBudget:
    full_tokens: int  # usable full-attention slots
    swa_tokens: int  # usable sliding-window slots
    one_pool_tokens: int  # the one-pool budget it replaces (same bytes)

    @property
    def capacity(self) -> int:
        return self.full_tokens + 1

    @property
    def swa_capacity(self) -> int:
        return self.swa_tokens + 1


def hybrid_budget(one_pool_tokens: int, full_bytes: int, swa_bytes: int, ratio: float,
                  full_tokens: int | None = None) -> HybridBudget:
    """The two budgets: from a memory budget, the bytes of ``one_pool_tokens`` one-pool tokens split so that
    ``full * full_bytes + ratio * full * swa_bytes`` fills them (SGLang's ``calculate_pool_sizes``); with
    ``full_tokens`` (``--max-total-tokens``, which names the full-attention budget in SGLang's hybrid pool:
    ``calculate_pool_sizes_from_max_tokens``) that many full-attention tokens and ``ratio`` times as many
    sliding-window ones (``one_pool_tokens`` is then the one-pool token count of the same bytes)."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"--swa-full-tokens-ratio should be in range (0, 1.0]; got {ratio}.")
    if full_tokens is not None:
        full = max(int(full_tokens), 1)
        swa = max(int(full * ratio), 1)
        return HybridBudget(full, swa, (full * full_bytes + swa * swa_bytes) // (full_bytes + swa_bytes))
    total = one_pool_tokens * (full_bytes + swa_bytes)
    full = int(total // (full_bytes + ratio * swa_bytes))
    swa = int(full * ratio)
    return HybridBudget(max(full, 1), max(swa, 1), one_pool_tokens)


class HybridSWAKVPool(TokenToKVPool):
    """Full layers: ``capacity`` rows; sliding layers: ``swa_capacity`` rows reached through ``full_to_swa``."""

    def __init__(self, model_config: ModelConfig, capacity: int, swa_capacity: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu", scales: KVScales | None = None):
        if swa_capacity < 2:
            raise ValueError(f"sliding-window pool capacity {swa_capacity} is too small (slot 0 is reserved)")
        self.swa_capacity = int(swa_capacity)
        self.swa_layers = frozenset(swa_layer_ids(model_config))
        self.full_to_swa: torch.Tensor | None = None  # registered by the allocator (register_mapping)
        super().__init__(model_config, capacity, dtype, device, scales)

    def register_mapping(self, full_to_swa: torch.Tensor) -> None:
        """The allocator's ``full_to_swa`` [capacity] int64: sliding layers' row of each full slot."""
        if full_to_swa.shape != (self.capacity,):
            raise ValueError(f"full_to_swa has shape {tuple(full_to_swa.shape)}, the pool {self.capacity} slots")
        self.full_to_swa = full_to_swa

    def rows(self, kv_layer_id: int) -> int:
        return self.swa_capacity if kv_layer_id in self.swa_layers else self.capacity

    def slot_map(self, kv_layer_id: int) -> torch.Tensor | None:
        if kv_layer_id not in self.swa_layers:
            return None
        if self.full_to_swa is None:
            raise RuntimeError("the hybrid pool has no slot map yet: build its SWATokenSlotAllocator first")
        return self.full_to_swa

    @property
    def full_bytes_per_token(self) -> int:
        return self.layer_bytes_per_token(sorted(set(self.layer_ids) - self.swa_layers))

    @property
    def swa_bytes_per_token(self) -> int:
        return self.layer_bytes_per_token(sorted(self.swa_layers))
