"""AttentionBackend: the interface every attention implementation offers the model.

The model calls, per pass:
  1. ``init_forward_metadata(fb)`` once: every row of ``fb`` is a query; request
     ``i``'s rows attend causally to its ``seq_lens[i]`` keys (cached prefix plus
     the new rows, all read from the KV pool after the new rows are written).
  2. ``forward(q, k, v, layer, fb)`` per layer. ``k``/``v`` are ``None`` for a
     KV-shared layer (it reads ``layer.kv_layer_id``'s buffers and writes nothing).
  3. With YOCO fast prefill, after the self-decoder:
     ``init_cross_decoder_metadata(fb, rows, rows_per_req)``: only ``rows``
     (indices into the batch, sorted, grouped by request) are queries, each over
     its request's full context; the cross-decoder layers then call ``forward``
     with ``q`` holding just those rows. The backend uses this metadata for
     KV-shared layers while ``fb.fast_prefill`` is set. The last self-decoder layer
     already runs this way (``impl/model/yoco.py``): it writes every row's K/V with
     ``store_kv(k, v, layer, fb)``, then calls ``forward`` with ``k = v = None`` and
     the selected rows' queries, over its own K/V.

Masks: a query at absolute position ``p`` sees keys at positions ``<= p``; in a
sliding layer with window ``W`` only keys at positions ``> p - W`` (itself and
the ``W - 1`` before it), in extend and decode alike. Scores are
``scaling * q.k`` (Gemma-4: 1.0), optionally ``cap * tanh(s / cap)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from impl.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionLayer:
    """Static facts of one attention layer (SGLang's RadixAttention, minus the module)."""

    layer_id: int
    kv_layer_id: int  # whose K/V buffers this layer reads (itself unless KV-shared)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float = 1.0
    sliding_window: int | None = None  # W: attend to self and W-1 previous positions
    logit_cap: float | None = None

    @property
    def is_kv_shared(self) -> bool:
        return self.kv_layer_id != self.layer_id


class AttentionBackend(ABC):
    name: str = "base"
    # --enable-deterministic-inference: a row's result must not depend on the rest of its batch (the triton
    # backend then never splits a request's keys, so decode sums them as the extend kernel does)
    deterministic: bool = False

    def __init__(self, model_config, token_to_kv_pool, req_to_token_pool, device):
        self.model_config = model_config
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.device = torch.device(device)

    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...

    @abstractmethod
    def init_cross_decoder_metadata(self, fb: ForwardBatch, rows: torch.Tensor, rows_per_req: list[int]) -> None:
        """YOCO back half: ``rows`` [R] (batch rows, grouped by request, ``rows_per_req[i]`` each)."""

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch) -> None:
        """Write this pass's K/V rows (``k``/``v`` [n, num_kv_heads * head_dim], one per ``fb.out_cache_loc``
        slot) into ``layer``'s buffers without attending; ``forward`` with ``k`` given does this first."""
        n, d = k.shape[0], layer.head_dim
        self.token_to_kv_pool.set_kv_buffer(layer.kv_layer_id, fb.out_cache_loc, k.view(n, -1, d), v.view(n, -1, d))

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [n, num_heads * head_dim]
        k: torch.Tensor | None,  # [n, num_kv_heads * head_dim] or None (KV-shared layer)
        v: torch.Tensor | None,
        layer: AttentionLayer,
        fb,
    ) -> torch.Tensor:  # [n, num_heads * head_dim]
        ...
