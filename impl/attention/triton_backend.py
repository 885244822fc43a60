"""TritonAttnBackend: the triton backend's metadata and kernels behind the AttentionBackend interface.

Per pass the model calls ``init_forward_metadata`` (every row a query) and, with
YOCO fast prefill, ``init_cross_decoder_metadata`` (selected rows only). Both
produce a :class:`TritonAttnMetadata`; the window and logit cap of each layer are
passed at launch, so sliding and full layers share one metadata. A request with
exactly one query row everywhere (decode, or a YOCO back half that kept only the
last row of each request) goes to the split-KV decode kernel; anything else to
the extend kernel. Who runs the kernels is the backend's *provider*
(``triton_providers.py``): compiled Triton on CUDA, the compiled CPU kernels on
CPU, or explicitly the Triton interpreter or the torch reference; all read this
same metadata.
"""

from __future__ import annotations

import impl.kernels.triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import torch

from impl.attention.base import AttentionBackend, AttentionLayer
from impl.attention.triton_metadata import TritonAttnMetadata, build_kv_indices, build_metadata
from impl.attention.triton_providers import ONE_SPLIT, KernelProvider, select_provider
from impl.cache.allocator import kv_generation
from impl.cache.kv_quant import is_fp8
from impl.forward_batch import ForwardBatch


class TritonAttnBackend(AttentionBackend):
    name = "triton"

    def __init__(self, model_config, token_to_kv_pool, req_to_token_pool, device):
        super().__init__(model_config, token_to_kv_pool, req_to_token_pool, device)
        self.num_kv_heads = max(1, int(getattr(model_config, "num_key_value_heads", 1) or 1))
        self.provider: KernelProvider = select_provider(self.device)
        self.forward_metadata: TritonAttnMetadata | None = None
        self.cross_metadata: TritonAttnMetadata | None = None
        self._batch = None  # the ForwardBatch forward_metadata was built for
        # KV buffers later layers read too (Gemma-4's cross-decoder reads its producers'): the CPU kernels keep
        # their AMX packing of these for the forward's other launches over them (KernelProvider.pack_epochs)
        producers = getattr(model_config, "kv_producer", ())
        self._shared_kv = {p for i, p in enumerate(producers) if p is not None and p != i}
        self._pack_epoch = 0
        # Set by the engine, whose allocator hands out every slot the pool's K/V is written to (cache/allocator.py):
        # decode launches then pass the KV generation, under which the CPU kernels keep packings across steps.
        # Off for a backend driven by hand (tests writing the pool directly, reusing slots without freeing them).
        self.keep_decode_packings = False
        # decode launches prepared this pass (provider.prepare_decode), by metadata, KV layer and the layer's attention
        # parameters: the layers sharing a KV layer launch over the same buffers and metadata
        self._prepared: dict[tuple, tuple] = {}

    # ---- metadata -----------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        # Keys: positions 0..seq_len-1 of each request (cached prefix + this pass's rows, which
        # forward() writes to the pool before attending). Queries: every row, at fb.positions.
        kv_indptr, kv_indices = build_kv_indices(
            self.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens_cpu
        )
        self.forward_metadata = build_metadata(
            fb.extend_seq_lens_cpu, fb.positions, kv_indptr, kv_indices, fb.seq_lens_cpu, self.num_kv_heads,
            # deterministic: one split per (request, KV head), so a decode row's keys are summed in the order the
            # extend kernel sums them when the same row rides in a prefill batch (a split-KV merge rounds differently)
            self.provider.fill_units, ONE_SPLIT if self.deterministic else self.provider.split_policy,
        )
        self.cross_metadata = None  # a back half belongs to one pass
        self._prepared.clear()
        self._batch = fb
        self._pack_epoch = self.provider.pack_epochs() if self.provider.pack_epochs and self._shared_kv else 0

    def init_cross_decoder_metadata(self, fb: ForwardBatch, rows: torch.Tensor, rows_per_req: list[int]) -> None:
        if len(rows_per_req) != fb.batch_size or sum(rows_per_req) != int(rows.shape[0]) or min(rows_per_req, default=0) < 0:
            raise ValueError(
                f"cross-decoder rows_per_req {rows_per_req} does not match {fb.batch_size} requests and "
                f"{int(rows.shape[0])} selected rows; pass one count per request summing to len(rows)."
            )
        if self.forward_metadata is None or self._batch is not fb:
            self.init_forward_metadata(fb)
        fwd = self.forward_metadata
        assert fwd is not None  # built just above
        # kv_indptr / kv_indices: the request's FULL context, prefix + every new token of this pass.
        # The producers (self-decoder layers) wrote all new tokens' K/V before the back half runs,
        # so the same keys as the forward metadata are valid; nothing is written (no out_cache_loc).
        self.cross_metadata = build_metadata(
            # qo_indptr from rows_per_req: q holds only the selected rows, packed request by request.
            rows_per_req,
            # q_positions: each selected row keeps its absolute position; causal and window masks use it,
            # so a row in the middle of a prompt (prompt logprobs) still sees only keys <= its position.
            fb.positions.index_select(0, rows.to(fb.positions.device)),
            fwd.kv_indptr,
            fwd.kv_indices,
            fb.seq_lens_cpu,
            self.num_kv_heads,
            self.provider.fill_units,
            # One split per (request, KV head): a selected row's keys are summed in the same order as the
            # extend kernel sums them with the flag off (a split-KV merge rounds differently), so fast
            # prefill's rows are bit-identical to the full pass's; the back half's few rows gain little
            # from splitting.
            ONE_SPLIT,
        )
        # The window is not stored: forward() passes layer.sliding_window at launch, as for every layer.
        self._prepared.clear()  # (keyed by the metadata's id: none may outlive the metadata it was made for)

    def _metadata_for(self, k, fb: ForwardBatch, n: int, layer: AttentionLayer) -> TritonAttnMetadata:
        if k is None and fb.fast_prefill:
            md = self.cross_metadata
            if md is None:
                raise ValueError(
                    f"layer {layer.layer_id} is KV-shared and fast prefill is on, but no cross-decoder metadata "
                    "exists; call init_cross_decoder_metadata(fb, rows, rows_per_req) after the self-decoder."
                )
        else:
            md = self.forward_metadata
        if md is None or md.num_queries != n:
            raise ValueError(
                f"attention metadata covers {None if md is None else md.num_queries} rows but layer {layer.layer_id} "
                f"passed {n}; call init_forward_metadata (or init_cross_decoder_metadata for YOCO) first."
            )
        return md

    # ---- compute ------------------------------------------------------------
    def forward(self, q, k, v, layer: AttentionLayer, fb: ForwardBatch) -> torch.Tensor:
        n, d = q.shape[0], layer.head_dim
        if k is not None:
            # New rows' K/V go to the pool first: the kernels read prefix and new keys alike through kv_indices.
            self.store_kv(k, v, layer, fb)
        md = self._metadata_for(k, fb, n, layer)
        if md.use_decode_kernel and self.provider.prepare_decode is not None:
            return self._decode_prepared(q, layer, fb, md)
        k_buf, v_buf, k_scale, v_scale, kv_indices, cast, epoch = self._layer_launch(layer, md, q.dtype)
        q3 = q.reshape(n, layer.num_heads, d)
        if cast is not None:
            q3 = q3.to(cast)
        o = torch.empty_like(q3)
        kw = {"pack_epoch": epoch} if epoch else {}
        if md.use_decode_kernel:
            if self._keeps_packings(fb):
                kw["kv_generation"] = kv_generation()
            self.provider.decode(
                q3, o, k_buf, v_buf, md.q_positions, md.kv_indptr, kv_indices, md.num_kv_splits, md.max_kv_splits,
                layer.scaling, layer.sliding_window, layer.logit_cap, k_scale, v_scale, **kw,
            )
        else:
            self.provider.extend(
                q3, o, k_buf, v_buf, md.qo_indptr, md.q_positions, md.kv_indptr, kv_indices, md.max_q_len,
                layer.scaling, layer.sliding_window, layer.logit_cap, k_scale, v_scale, **kw,
            )
        return (o if o.dtype == q.dtype else o.to(q.dtype)).view(n, -1)

    def _layer_launch(self, layer: AttentionLayer, md: TritonAttnMetadata, q_dtype: torch.dtype) -> tuple:
        """What a layer's launches over ``md`` pass besides q and o: its K/V buffers ([capacity, KVH, D]) and scales,
        the slots they are read at, the dtype q is cast to (the pool's; None: q keeps its own, as over an fp8 pool)
        and the pack epoch (0: none)."""
        k_buf, v_buf = self.token_to_kv_pool.get_kv_buffer(layer.kv_layer_id)
        k_scale, v_scale = self.token_to_kv_pool.get_kv_scales(layer.kv_layer_id)
        kv_indices = md.kv_indices_for(self.token_to_kv_pool.slot_map(layer.kv_layer_id))
        cast = k_buf.dtype if q_dtype != k_buf.dtype and not is_fp8(k_buf.dtype) else None
        epoch = self._pack_epoch if self._pack_epoch and layer.kv_layer_id in self._shared_kv else 0
        return k_buf, v_buf, k_scale, v_scale, kv_indices, cast, epoch

    def _keeps_packings(self, fb: ForwardBatch) -> bool:
        """Decode launches pass the pool's KV generation, under which the CPU kernels keep packings across steps."""
        return self.keep_decode_packings and self.provider.keeps_packings and fb.forward_mode.is_decode

    def _decode_prepared(self, q, layer: AttentionLayer, fb: ForwardBatch, md: TritonAttnMetadata) -> torch.Tensor:
        """``forward``'s decode launch through a launch prepared once per pass for this metadata, KV layer and
        attention parameters (the same arguments, so the same kernel call and bits)."""
        n = q.shape[0]
        key = (id(md), layer.kv_layer_id, layer.num_heads, layer.head_dim, layer.scaling, layer.sliding_window,
               layer.logit_cap)
        prepared = self._prepared.get(key)
        q3 = q.reshape(n, layer.num_heads, layer.head_dim)
        if prepared is None:
            k_buf, v_buf, k_scale, v_scale, kv_indices, cast, epoch = self._layer_launch(layer, md, q.dtype)
            qc = q3 if cast is None else q3.to(cast)
            assert self.provider.prepare_decode is not None  # forward() checked
            launch = self.provider.prepare_decode(
                qc, torch.empty_like(qc), k_buf, v_buf, md.q_positions, md.kv_indptr, kv_indices, md.num_kv_splits,
                md.max_kv_splits, layer.scaling, layer.sliding_window, layer.logit_cap, k_scale, v_scale, pack_epoch=epoch,
            )
            prepared = self._prepared[key] = (launch, cast, self._keeps_packings(fb))
        launch, cast, keeps = prepared
        if cast is not None:
            q3 = q3.to(cast)
        o = launch(q3, torch.empty_like(q3), kv_generation() if keeps else 0)
        return (o if o.dtype == q.dtype else o.to(q.dtype)).view(n, -1)
