"""Mutants of the engine, the triton backend and YOCO fast prefill (issues 5, 6, 7).

Each patches one function of the implementation; engines built by the impl
adapter are cached per argv, so every patch targets something looked up at call
time (a module attribute or a class attribute).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from contracts.mutants import mutant
from contracts.mutants.patching import PatchedSubject


def _orig(module: str, attr: str):
    import importlib

    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---- YOCO (issue 7) -----------------------------------------------------------------
@mutant("PARITY-PROMPT-LOGPROBS")
class GatherPicksFirstToken(PatchedSubject):
    """The cross-decoder gathers each request's first rows instead of its LM-head rows."""

    def patches(self):
        def first_rows(fb):
            starts = fb.extend_start_loc_cpu
            rows = [s + j for s, n in zip(starts, fb.logits_lens_cpu) for j in range(n)]
            return torch.tensor(rows, dtype=torch.int64, device=fb.logits_indices.device)

        return {"impl.model.yoco:select_rows": first_rows}


def attend_writing_selected_kv(q, k, v, layer, fb, rows):
    """``yoco.attend`` that, in the layer cut at the LM-head rows, writes only those rows' K/V."""
    if rows is None:
        return fb.attn_backend.forward(q, k, v, layer, fb)
    every = fb.out_cache_loc
    fb.out_cache_loc = every.index_select(0, rows.to(every.device))
    try:
        fb.attn_backend.store_kv(k.index_select(0, rows), v.index_select(0, rows), layer, fb)
    finally:
        fb.out_cache_loc = every
    return fb.attn_backend.forward(q.index_select(0, rows), None, None, layer, fb)


@mutant("PARITY-GREEDY", "PARITY-EDGE-BATCHES", "PARITY-PROMPT-LOGPROBS")
class CutLayerWritesSelectedKV(PatchedSubject):
    """The last self-decoder layer, cut at the LM-head rows, writes only those rows' K/V: the other slots keep
    whatever the pool held, which that layer's own attention and every later chunk and decode step read."""

    PATCHES = {"impl.model.yoco:attend": attend_writing_selected_kv}


def drop_cached_prefix(md, fb) -> None:
    """Cut each request's keys in the back half's metadata ``md`` to this pass's new tokens (its cached prefix,
    an earlier chunk's or a prefix-cache hit's, left out)."""
    keep, indptr = [], [0]
    for b, (p, s) in enumerate(zip(fb.extend_prefix_lens_cpu, fb.seq_lens_cpu)):
        lo = int(md.kv_indptr[b])
        keep.append(md.kv_indices[lo + p : lo + s])
        indptr.append(indptr[-1] + s - p)
    md.kv_indices = torch.cat(keep)
    md.kv_indptr = torch.tensor(indptr, dtype=md.kv_indptr.dtype, device=md.kv_indptr.device)


@mutant("PARITY-PROMPT-LOGPROBS")
class CrossMetadataOmitsPrefix(PatchedSubject):
    """The back-half metadata lists only this pass's new tokens as keys, not the cached prefix."""

    def patches(self):
        orig = _orig("impl.attention.triton_backend", "TritonAttnBackend.init_cross_decoder_metadata")

        def without_prefix(self, fb, rows, rows_per_req):
            orig(self, fb, rows, rows_per_req)
            drop_cached_prefix(self.cross_metadata, fb)

        return {"impl.attention.triton_backend:TritonAttnBackend.init_cross_decoder_metadata": without_prefix}


@mutant("WORK-CROSS-DECODER-ROWS")
class FastPrefillNeverApplies(PatchedSubject):
    """The flag is accepted but no batch takes the fast path (the cross-decoder runs on every row)."""

    PATCHES = {"impl.model.yoco:applies": lambda enabled, extend_seq_lens: False}


# ---- engine (issue 5) -----------------------------------------------------------------
@mutant("ENGINE-GREEDY-MATCHES-TRANSFORMERS")
class PleScaleMissing(PatchedSubject):
    """Per-layer embeddings are combined without the 2^-0.5 scale."""

    PATCHES = {"impl.model.ple:PER_LAYER_INPUT_SCALE": 1.0}


@mutant("ENGINE-OUTPUTS-INVARIANT")
class CachedPrefixPositionsRestart(PatchedSubject):
    """A forward that extends a cached prefix (a later chunk, a cache hit) numbers its rows from 0."""

    def patches(self):
        orig = _orig("impl.engine.schedule_batch", "ScheduleBatch.to_forward_batch")

        def to_forward_batch(self, *args, **kwargs):
            fb = orig(self, *args, **kwargs)
            row = 0
            for it in self.items:
                if it.start > 0 and it.n > 1:
                    fb.positions[row : row + it.n] -= it.start
                row += it.n
            return fb

        return {"impl.engine.schedule_batch:ScheduleBatch.to_forward_batch": to_forward_batch}


@mutant("ENGINE-SEEDED-SAMPLING-REPEATS")
class SamplerIgnoresSeed(PatchedSubject):
    """Sampling draws from a fresh random generator instead of the request's seeded one."""

    def patches(self):
        orig = _orig("impl.sampling.sampler", "_draw_row")

        def draw(scaled, probs, row):
            fresh = dataclasses.replace(row, generator=torch.Generator().manual_seed(random.randrange(2**31)))
            return orig(scaled, probs, fresh)

        return {"impl.sampling.sampler:_draw_row": draw}


@mutant("ENGINE-KV-FREED")
class LeaksOneSlotPerFree(PatchedSubject):
    """Freeing KV slots forgets the last slot of every batch it frees."""

    def patches(self):
        orig = _orig("impl.cache.allocator", "TokenSlotAllocator.free")

        def free(self, slots):
            return orig(self, slots[:-1])

        return {"impl.cache.allocator:TokenSlotAllocator.free": free}


# ---- triton (issue 6) -----------------------------------------------------------------
@mutant("TRITON-GREEDY-PARITY")
class TritonIgnoresSlidingWindow(PatchedSubject):
    """The triton backend attends to the whole context in sliding layers."""

    def patches(self):
        orig = _orig("impl.attention.triton_backend", "TritonAttnBackend.forward")

        def forward(self, q, k, v, layer, fb):
            return orig(self, q, k, v, dataclasses.replace(layer, sliding_window=None), fb)

        return {"impl.attention.triton_backend:TritonAttnBackend.forward": forward}


# ---- fault isolation (issue 14) -------------------------------------------------------
class _FaultsPatched(PatchedSubject):
    def generate_with_faults(self, argv, runs):
        with self._ctx():
            return self.inner.generate_with_faults(argv, runs)


@mutant("ENGINE-FAULT-ONE-FINAL")
class FailedRequestNeverAnswered(_FaultsPatched):
    """A failed request is dropped from the queues and its KV freed, but it never gets a final output."""

    def patches(self):
        def fail_request(self, req, exc, stage, status=500, message=None):
            self.queues.remove(req)
            self.kv.discard(req)
            req.finished_reason = FinishReason("abort", message="failed", status_code=status)  # never emitted

        from impl.engine.req import FinishReason

        return {"impl.engine.fault_isolation:FaultIsolation.fail_request": fail_request}


@mutant("ENGINE-FAULT-ONE-FINAL")
class FaultAbortsEveryRequest(_FaultsPatched):
    """The pre-issue-14 behaviour: one request's failure aborts every request in flight."""

    def patches(self):
        orig = _orig("impl.engine.fault_isolation", "FaultIsolation.fail_request")
        from impl.engine.req import FinishReason

        def fail_request(self, req, exc, stage, status=500, message=None):
            orig(self, req, exc, stage, status, message)
            # what the engine loop used to do: abort everything in flight
            for r in list(self.queues.waiting) + self.queues.live:
                self.queues.remove(r)
                self.kv.release(r)
                self.finish(r, FinishReason("abort", message="aborted by request"))

        return {"impl.engine.fault_isolation:FaultIsolation.fail_request": fail_request}
