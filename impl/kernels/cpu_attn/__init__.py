"""Compiled CPU attention kernels: the triton backend's extend and decode kernels for CPU tensors.

``attention.cpp`` (a C++ extension built on first use with ``impl.kernels.cpp_build``) implements
the same two launches as ``impl/kernels/extend_attention.py`` and ``decode_attention.py``, with the
same arguments: the metadata of ``impl/attention/triton_metadata.py`` (qo_indptr, q_positions,
kv_indptr, kv_indices, num_kv_splits), the window and logit cap per layer. So the YOCO back half's
metadata (``init_cross_decoder_metadata``) is what they read too. Float32, bfloat16 and float16
pools, and fp8 pools (float8_e4m3fn / float8_e5m2, dequantised in the kernel with the layer's K / V
scale); scores, softmax and the output accumulate in float32. Tiles over the keys run register-blocked
SIMD micro-kernels, work items on ATen's OpenMP pool (see the header of ``attention.cpp``; the build
needs ``-fopenmp``, since ATen's ``parallel_for`` is an inline OpenMP pragma). Extend and decode launches of bf16 queries over a bf16 or fp8
pool run Q K^T and P V as bf16 pair products with float32 accumulation: on AMX tiles where the CPU has AMX-bf16, else
with AVX512-BF16's VDPBF16PS (``kernel_isa()`` says which; ``IMPL_CPU_AMX=0`` turns the tiles off,
``IMPL_CPU_ATTN_BF16=0`` both, keeping the float32 SIMD kernels). ``rows_attention`` serves
the torch_native backend: the same work items over its per-row metadata (``req_to_token``, each row's
request and position).

``load()`` returns None, after one warning, when ninja or a compiler is missing or the build fails;
the triton backend then runs the torch reference over the same metadata
(``impl.kernels.reference``). ``IMPL_CPU_ATTN=0`` turns the kernels off.
"""

from __future__ import annotations

import itertools
import logging
import os
from types import ModuleType

import torch

from impl.kernels.checks import check_decode_launch, check_extend_launch, check_kv_scales
from impl.envs import envs
from impl.kernels.cpp_build import LazyExtension

logger = logging.getLogger("impl.kernels")

ENV_SWITCH = envs.IMPL_CPU_ATTN.name
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.cpp")
_CFLAGS = ["-O3", "-march=native", "-std=c++17", "-fopenmp"]

EXTENSION = LazyExtension("impl_cpu_attn", _SOURCE, _CFLAGS, envs.IMPL_CPU_ATTN, "compiled CPU attention kernels", "the triton backend runs the torch reference attention on CPU")
enabled_by_env = EXTENSION.enabled_by_env
load = EXTENSION.load
error = EXTENSION.error


def kernel_isa() -> dict[str, str]:
    """The instructions each kernel runs on (the startup log and ``/get_server_info``): for bfloat16 queries over a
    bfloat16 or fp8 pool (head_dim a multiple of 32) AMX-bf16 tiles where the CPU has AMX (``IMPL_CPU_AMX=0``: off),
    else AVX512-BF16 pair products where it has those (``IMPL_CPU_ATTN_BF16=0``: neither), else the build's SIMD
    micro-kernels. Extend and decode always take the same path:
    fast prefill's back half sends a request's one selected row to the decode kernel, and its parity with the
    full prefill needs that row's bits to equal the extend kernel's."""
    ext = _ext()
    envs.IMPL_CPU_ATTN_BF16.get()  # attention.cpp reads it raw: a bad value stops here
    simd = ext.simd_isa()
    tiles = ext.extend_isa(torch.bfloat16, torch.bfloat16, 256)
    if tiles == simd:
        return {"extend": simd, "decode": simd}
    keep = envs.IMPL_CPU_ATTN_KEEP_MB.get()
    kept = f"; packed keys kept across steps, at most {keep} MB" if keep else "; packed keys kept: none"
    return {"extend": f"{tiles} (bf16 / fp8 KV with bf16 queries), {simd} otherwise",
            "decode": f"{tiles} (bf16 / fp8 KV with bf16 queries{kept}), {simd} otherwise"}


def _ext() -> ModuleType:
    ext = load()
    if ext is None:
        raise ValueError(f"the compiled CPU attention kernels are not available ({error() or ENV_SWITCH + '=0'})")
    return ext


# pack_epoch: the bf16-pair path (AMX tiles or AVX512-BF16) packs each request's keys into the tiles' layout once per launch. Within one forward the
# KV-shared layers (Gemma-4's cross-decoder) read their producer layer's K/V, unchanged since the producer's own
# launch, so launches over a producer's buffers that pass the same pack_epoch (> 0, never reused in the process:
# ``next_pack_epoch()``) reuse its packing instead of packing again (the same bits; attention.cpp,
# ``pair_pack_requests``). The caller passes it only for those buffers, and a new epoch for every forward.
_PACK_EPOCHS = itertools.count(1)


# kv_generation (decode only): the bf16-pair path also keeps each request's packing from one decode launch to the next
# and packs only the keys after it (a decode step adds one key per request). The caller passes the KV pool's
# generation (impl.cache.allocator.kv_generation: it moves whenever a slot read without a slot map is freed, and a
# slot's K/V is written only after the slot was handed out from the free list), under which a packing of a
# request's slots still holds their keys; 0 keeps nothing. Launches through a slot map keep nothing.
# IMPL_CPU_ATTN_KEEP_MB bounds what is kept (default 512).


def kept_packings() -> tuple[int, int]:
    """(entries, bytes) of the packings decode keeps across steps, after an integrity check (RuntimeError if
    inconsistent); (0, 0) when the extension was never loaded."""
    ext = EXTENSION.loaded()
    if ext is None:
        return 0, 0
    entries, nbytes = ext.kept_packings_check()
    return int(entries), int(nbytes)


def drop_kept_packings() -> None:
    """Free what decode keeps across steps (an engine shutting down; the next decode step packs again)."""
    ext = EXTENSION.loaded()
    if ext is not None:
        ext.drop_kept_packings()


def next_pack_epoch() -> int:
    return next(_PACK_EPOCHS)


def _check_cpu(*tensors: torch.Tensor, name: str) -> None:
    for t in tensors:
        if not t.is_cpu:
            raise ValueError(f"{name}: the CPU kernels take CPU tensors, got one on {t.device}")


def extend_attention_fwd(
    q: torch.Tensor,  # [Tq, H, D]
    o: torch.Tensor,  # [Tq, H, D] (written)
    k_buf: torch.Tensor,  # [capacity, KVH, D]
    v_buf: torch.Tensor,
    qo_indptr: torch.Tensor,  # [B + 1]
    q_positions: torch.Tensor,  # [Tq]
    kv_indptr: torch.Tensor,  # [B + 1]
    kv_indices: torch.Tensor,  # [>= kv_indptr[-1]]
    max_q_len: int,  # unused (the Triton grid size), kept so both providers take one signature
    sm_scale: float,
    window: int | None = None,
    logit_cap: float | None = None,
    k_scale: float = 1.0,  # pool value = K / k_scale (fp8 pools; 1.0 otherwise)
    v_scale: float = 1.0,
    pack_epoch: int = 0,  # > 0: the forward's epoch (next_pack_epoch); 0: nothing kept
) -> torch.Tensor:
    name = "cpu_attn.extend_attention_fwd"
    batch = check_extend_launch(name, q, o, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, window,
                                logit_cap, k_scale, v_scale)
    _check_cpu(q, k_buf, name=name)
    if batch == 0 or q.shape[0] == 0:
        return o
    _ext().extend_attention(q, o, k_buf, v_buf, qo_indptr, q_positions, kv_indptr, kv_indices, float(sm_scale),
                            int(window or 0), float(logit_cap or 0.0), float(k_scale), float(v_scale), int(pack_epoch))
    return o


def decode_attention_fwd(
    q: torch.Tensor,  # [B, H, D]
    o: torch.Tensor,  # [B, H, D] (written)
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    q_positions: torch.Tensor,  # [B]
    kv_indptr: torch.Tensor,  # [B + 1]
    kv_indices: torch.Tensor,
    num_kv_splits: torch.Tensor,  # [B], each in 1..max_kv_splits
    max_kv_splits: int,
    sm_scale: float,
    window: int | None = None,
    logit_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    pack_epoch: int = 0,
    kv_generation: int = 0,  # > 0: the pool's generation (impl.cache.allocator.kv_generation); 0: nothing kept
) -> torch.Tensor:
    name = "cpu_attn.decode_attention_fwd"
    batch = check_decode_launch(name, q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits,
                                max_kv_splits, window, logit_cap, k_scale, v_scale)
    _check_cpu(q, k_buf, name=name)
    if batch == 0:
        return o
    _ext().decode_attention(q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits,
                            *_decode_scalars(max_kv_splits, sm_scale, window, logit_cap, k_scale, v_scale, pack_epoch),
                            int(kv_generation))
    return o


def _decode_scalars(max_kv_splits: int, sm_scale: float, window: int | None, logit_cap: float | None, k_scale: float,
                    v_scale: float, pack_epoch: int) -> tuple[int, float, int, float, float, float, int]:
    """The extension's decode_attention scalars, in its order (no window / cap: 0)."""
    return (int(max_kv_splits), float(sm_scale), int(window or 0), float(logit_cap or 0.0), float(k_scale), float(v_scale),
            int(pack_epoch))


class DecodeLaunch:
    """``decode_attention_fwd`` over one metadata and one layer's buffers, checked once and then launched per
    layer: a decode step makes 35 launches that differ only in q and o (the KV-shared layers read their producer's
    buffers through the same metadata). Through it the triton backend's decode ``forward`` at one row took 68 us
    instead of 102 for a K/V-writing layer and 45 instead of 62 for a KV-shared one (the kernel itself: ~31 us; e2b_bench,
    AVX2 Zen 3, timed in a loop). A q of another shape, dtype or layout than the one checked goes through
    ``decode_attention_fwd`` and its checks."""

    def __init__(self, q: torch.Tensor, o: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                 q_positions: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 num_kv_splits: torch.Tensor, max_kv_splits: int, sm_scale: float, window: int | None = None,
                 logit_cap: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0, pack_epoch: int = 0):
        name = "cpu_attn.decode_attention_fwd"
        self.batch = check_decode_launch(name, q, o, k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits,
                                         max_kv_splits, window, logit_cap, k_scale, v_scale)
        _check_cpu(q, k_buf, name=name)
        self._ext = _ext()
        self._q = (q.shape, q.dtype, q.stride())
        self._bufs = (k_buf, v_buf, q_positions, kv_indptr, kv_indices, num_kv_splits)
        self._scalars = _decode_scalars(max_kv_splits, sm_scale, window, logit_cap, k_scale, v_scale, pack_epoch)
        self._given = (max_kv_splits, sm_scale, window, logit_cap, k_scale, v_scale, pack_epoch)  # as passed

    def __call__(self, q: torch.Tensor, o: torch.Tensor, kv_generation: int = 0) -> torch.Tensor:
        """o [B, H, D] = attention of q [B, H, D] (o: empty_like(q)); kv_generation as decode_attention_fwd's."""
        if ((q.shape, q.dtype, q.stride()) != self._q or o.shape != q.shape or o.dtype != q.dtype
                or o.stride() != q.stride() or not (q.is_cpu and o.is_cpu)):
            m, scale, window, cap, ks, vs, epoch = self._given
            return decode_attention_fwd(q, o, *self._bufs, m, scale, window, cap, ks, vs, epoch, kv_generation)
        if self.batch:
            self._ext.decode_attention(q, o, *self._bufs, *self._scalars, int(kv_generation))
        return o


def rows_attention(
    q: torch.Tensor,  # [n, H, D]
    k_buf: torch.Tensor,  # [capacity, KVH, D]: q's dtype, fp8, or bfloat16 / float16 under float32 q
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,  # [R, M] int64
    row_req: torch.Tensor,  # [n] req_to_token row of each query row
    q_pos: torch.Tensor,  # [n] absolute position of each query row
    window: int | None,
    sm_scale: float,
    logit_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    slot_map: torch.Tensor | None = None,  # [N] int64: buffer row of each req_to_token slot (None: the slot itself)
) -> torch.Tensor:
    """Query rows over the paged pool through ``req_to_token`` (torch_native's metadata): row ``i`` sees
    positions ``max(0, p - window + 1) .. p`` (no window: ``0 .. p``) of request row ``row_req[i]``,
    read at rows ``slot_map[req_to_token[...]]`` of the buffers when a slot map is given (the hybrid pool's
    sliding layers). Runs of consecutive rows of one request share work items, as extend rows do.
    Returns [n, H, D]."""
    name = "cpu_attn.rows_attention"
    _check_cpu(q, k_buf, name=name)
    check_kv_scales(name, k_scale, v_scale)
    empty = torch.empty(0, dtype=torch.int64)
    return _ext().rows_attention(q, k_buf, v_buf, req_to_token, row_req, q_pos, int(window or 0), float(sm_scale),
                                 float(logit_cap or 0.0), float(k_scale), float(v_scale),
                                 empty if slot_map is None else slot_map)
