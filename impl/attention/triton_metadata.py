"""Metadata the triton attention kernels read, and its builders.

General case: *queries with explicit positions over a request's keys*. Request
``b`` owns query rows ``qo_indptr[b]:qo_indptr[b+1]`` of ``q`` (absolute
positions ``q_positions``) and keys ``0..seq_len_b - 1`` whose KV slots are
``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``. Extend, decode, mixed batches and
YOCO's back half are all instances; only the query side differs. The window is
not part of the metadata: it is passed per layer at launch (sliding and full
layers share one metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.kernels.decode_attention import num_kv_splits_for
from impl.kernels.launch_config import KVSplitPolicy, kv_split_policy


@dataclass
class TritonAttnMetadata:
    num_queries: int  # rows of q the layers pass
    max_q_len: int  # host copy: most query rows of one request (sizes the extend grid)
    qo_indptr: torch.Tensor  # [B + 1] int32
    q_positions: torch.Tensor  # [num_queries] int64, absolute position of each query row
    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_indices: torch.Tensor  # [sum(seq_lens)] int64 KV slots, request by request, position order
    # Exactly one query per request: run the split-KV decode kernel (parallel over the context).
    use_decode_kernel: bool
    num_kv_splits: torch.Tensor | None = None  # [B] int32 (decode kernel only)
    max_kv_splits: int = 1
    # kv_indices through the hybrid pool's full -> sliding-window slot map (made on first use in a pass)
    swa_kv_indices: torch.Tensor | None = None

    def kv_indices_for(self, slot_map: torch.Tensor | None) -> torch.Tensor:
        """The slots a layer's buffers are read at: ``kv_indices``, or mapped for sliding layers of the
        hybrid pool (a freed window position maps to the zero pad row, which no query's mask admits)."""
        if slot_map is None:
            return self.kv_indices
        if self.swa_kv_indices is None:
            self.swa_kv_indices = slot_map.index_select(0, self.kv_indices.long())
        return self.swa_kv_indices

    def check(self) -> None:
        b = self.qo_indptr.shape[0] - 1
        assert self.kv_indptr.shape[0] == b + 1, "qo_indptr and kv_indptr disagree on the batch size"
        assert self.q_positions.shape[0] == self.num_queries, "one position per query row"
        if self.use_decode_kernel:
            assert self.num_queries == b and self.num_kv_splits is not None, "decode kernel: one query per request"


def _indptr(lens: list[int], device) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def build_kv_indices(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens_cpu: list[int]):
    """(kv_indptr [B+1] int32, kv_indices [sum] int64): request b's slots of positions 0..seq_len_b-1.

    Vectorised gather from ``req_to_token`` with host-side lengths: no device sync. Entry j of the result (request
    b's key t = j - indptr[b]) is element ``row_b * width + t`` of the flattened table: one 1-D gather (the 2-D
    advanced index it replaced took 480 us a forward for 32 requests of ~700 keys on a 2-core CPU, this 100).
    """
    device = req_to_token.device
    kv_indptr = _indptr(seq_lens_cpu, device)
    total = sum(seq_lens_cpu)
    lens = torch.tensor(seq_lens_cpu, dtype=torch.int64, device=device)
    table = req_to_token.contiguous()
    base = req_pool_indices.to(device).long() * table.shape[1] - kv_indptr[:-1].long()  # [B]: row_b * width - indptr_b
    flat = torch.repeat_interleave(base, lens, output_size=total) + torch.arange(total, device=device)
    kv_indices = table.view(-1).index_select(0, flat)
    return kv_indptr, kv_indices


def build_metadata(
    q_lens: list[int],
    q_positions: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens_cpu: list[int],
    num_kv_heads: int,
    num_sms: int | None,
    split_policy: KVSplitPolicy | None = None,
) -> TritonAttnMetadata:
    """Metadata for ``q_lens[b]`` query rows of request ``b`` at ``q_positions`` over the given keys.

    Decode splits follow ``split_policy`` (default: the Triton launch policy), filling ``num_sms``
    parallel units (GPU SMs, CPU threads) twice over; ``None``: no fill limit."""
    device = kv_indptr.device
    single = len(q_lens) > 0 and all(n == 1 for n in q_lens)
    md = TritonAttnMetadata(
        num_queries=sum(q_lens),
        max_q_len=max(q_lens, default=0),
        qo_indptr=_indptr(q_lens, device),
        q_positions=q_positions.to(device),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        use_decode_kernel=single,
    )
    if single:
        policy = split_policy or kv_split_policy()
        splits = num_kv_splits_for(seq_lens_cpu, num_kv_heads, policy, num_sms)
        md.num_kv_splits = torch.tensor(splits, dtype=torch.int32, device=device)
        md.max_kv_splits = max(splits)
    md.check()
    return md
