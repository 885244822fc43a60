"""KV storage: per-token K/V buffers for KV-owning layers, and the request -> token-slot table.

Only layers that write K/V (``config.kv_layer_ids``, the self-decoder) own
buffers; each has its own head count and head dim (sliding vs full layers
differ on Gemma-4). KV-shared layers read their producer's buffers. Neither
class decides which slots a request gets: the allocator and radix cache do.

An fp8 pool (``impl/cache/kv_quant.py``) stores ``value / scale`` per layer; readers get the
scales from ``get_kv_scales`` and dequantise in their kernels.
"""

from __future__ import annotations

import torch

from impl.cache.base import TokenToKVPoolBase
from impl.cache.kv_quant import KVScales, is_fp8, quantize
from impl.config.model_config import ModelConfig


class TokenToKVPool(TokenToKVPoolBase):
    def __init__(self, model_config: ModelConfig, capacity: int, dtype: torch.dtype, device: str | torch.device = "cpu",
                 scales: KVScales | None = None):
        if capacity < 2:
            raise ValueError(f"KV pool capacity {capacity} is too small: slot 0 is reserved, so at least 2 slots are needed.")
        self.config = model_config
        self.capacity = int(capacity)
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_ids = tuple(model_config.kv_layer_ids)
        self.scales = scales or KVScales()
        self.quantized = is_fp8(dtype)
        # k_buffers[layer]: [rows(layer), num_kv_heads(layer), head_dim(layer)]; row 0 is the pad slot.
        self.k_buffers: dict[int, torch.Tensor] = {}
        self.v_buffers: dict[int, torch.Tensor] = {}
        for i in self.layer_ids:
            shape = (self.rows(i), model_config.layer_num_kv_heads[i], model_config.layer_head_dims[i])
            self.k_buffers[i] = torch.zeros(shape, dtype=dtype, device=self.device)
            self.v_buffers[i] = torch.zeros(shape, dtype=dtype, device=self.device)

    def rows(self, kv_layer_id: int) -> int:
        """Buffer rows of a KV-owning layer (every layer: ``capacity``; the hybrid pool's sliding layers fewer)."""
        return self.capacity

    def slot_map(self, kv_layer_id: int) -> torch.Tensor | None:
        """The map from ``req_to_token`` slots to this layer's buffer rows (None: a slot is its own row)."""
        return None

    def _check_layer(self, kv_layer_id: int) -> None:
        if kv_layer_id not in self.k_buffers:
            raise ValueError(
                f"layer {kv_layer_id} owns no KV buffer (KV-owning layers: {self.layer_ids[0] if self.layer_ids else '-'}.."
                f"{self.layer_ids[-1] if self.layer_ids else '-'}); a KV-shared layer must read its producer's kv_layer_id."
            )

    def get_kv_buffer(self, kv_layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_layer(kv_layer_id)
        return self.k_buffers[kv_layer_id], self.v_buffers[kv_layer_id]

    def get_kv_scales(self, kv_layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) the layer's K/V buffers were written with (1.0 unless fp8 with a scale file)."""
        return self.scales.get(kv_layer_id) if self.quantized else (1.0, 1.0)

    def set_kv_buffer(self, kv_layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self._check_layer(kv_layer_id)
        kb, vb = self.k_buffers[kv_layer_id], self.v_buffers[kv_layer_id]
        k, v = k.view(-1, *kb.shape[1:]), v.view(-1, *vb.shape[1:])
        rows = self.slot_map(kv_layer_id)
        if rows is not None:
            loc = rows.index_select(0, loc)
        if self.quantized:
            # fp8 rows go in as bytes (index_copy_ has no fp8 kernel on CPU)
            ks, vs = self.scales.get(kv_layer_id)
            kb.view(torch.uint8).index_copy_(0, loc, quantize(k, ks, kb.dtype).view(torch.uint8))
            vb.view(torch.uint8).index_copy_(0, loc, quantize(v, vs, vb.dtype).view(torch.uint8))
            return
        kb.index_copy_(0, loc, k.to(kb.dtype))
        vb.index_copy_(0, loc, v.to(vb.dtype))

    def layer_bytes_per_token(self, layer_ids) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return sum(2 * self.k_buffers[i].shape[1] * self.k_buffers[i].shape[2] * elem for i in layer_ids)

    @property
    def total_bytes(self) -> int:
        """Bytes of every K and V buffer (the hybrid pool's sliding-window layers hold fewer rows)."""
        return sum(b.numel() * b.element_size() for bufs in (self.k_buffers, self.v_buffers) for b in bufs.values())

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes one token takes in every KV-owning layer."""
        return self.layer_bytes_per_token(self.layer_ids)

    @property
    def num_kv_layers(self) -> int:
        return len(self.layer_ids)

    @property
    def size(self) -> int:
        """Usable slots (slot 0 is reserved)."""
        return self.capacity - 1


class ReqToTokenPool:
    """``req_to_token[r, j]``: KV slot of token ``j`` of the request living in row ``r``."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu"):
        if size < 1 or max_context_len < 1:
            raise ValueError(f"ReqToTokenPool needs size >= 1 and max_context_len >= 1, got {size} and {max_context_len}.")
        self.size = int(size)
        self.max_context_len = int(max_context_len)
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((self.size, self.max_context_len), dtype=torch.int64, device=self.device)
        self._free: list[int] = list(range(self.size - 1, -1, -1))  # pop() hands out row 0 first
        self._used: set[int] = set()

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        idx = self._free.pop()
        self._used.add(idx)
        return idx

    def free(self, idx: int) -> None:
        if idx not in self._used:
            raise ValueError(f"request row {idx} is not allocated (double free or never allocated).")
        self._used.remove(idx)
        self.req_to_token[idx].zero_()
        self._free.append(idx)

    def check_integrity(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a request row is on the free list twice"
        assert not (free & self._used), f"rows both free and in use: {sorted(free & self._used)}"
        assert free | self._used == set(range(self.size)), "a request row leaked (neither free nor in use)"
