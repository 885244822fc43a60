"""A minimal serving loop for model tests: pools, a bump slot allocator, and ForwardBatch building."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.attention.torch_native import TorchNativeAttnBackend
from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from impl.forward_batch import ForwardBatch, ForwardMode, WorkCounters


@dataclass
class _Req:
    row: int
    length: int = 0


class Session:
    """Holds KV for named requests; ``step`` packs new tokens of several requests into one ForwardBatch."""

    def __init__(self, model, capacity: int = 4096, max_reqs: int = 8, max_ctx: int = 1024, backend_cls=TorchNativeAttnBackend):
        cfg = model.config
        self.model = model
        self.kv_pool = TokenToKVPool(cfg, capacity, model.dtype, "cpu")
        self.req_pool = ReqToTokenPool(max_reqs, max_ctx, "cpu")
        self.backend = backend_cls(cfg, self.kv_pool, self.req_pool, "cpu")
        self.reqs: dict[str, _Req] = {}
        self.next_slot = 1  # slot 0 is the pad slot
        self.work = WorkCounters()

    def build(self, batch: list[tuple[str, list[int]]], all_logits: bool = False, fast_prefill: bool = False) -> ForwardBatch:
        ids, pos, locs, rpi, prefix, ext, logit_rows, logit_lens = [], [], [], [], [], [], [], []
        row = 0
        for name, toks in batch:
            r = self.reqs.get(name)
            if r is None:
                r = self.reqs[name] = _Req(self.req_pool.alloc())
            n = len(toks)
            slots = list(range(self.next_slot, self.next_slot + n))
            self.next_slot += n
            self.req_pool.req_to_token[r.row, r.length : r.length + n] = torch.tensor(slots)
            ids += toks
            pos += list(range(r.length, r.length + n))
            locs += slots
            rpi.append(r.row)
            prefix.append(r.length)
            ext.append(n)
            sel = list(range(row, row + n)) if all_logits else [row + n - 1]
            logit_rows += sel
            logit_lens.append(len(sel))
            r.length += n
            row += n
        t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        mode = ForwardMode.DECODE if all(e == 1 for e in ext) else ForwardMode.EXTEND
        return ForwardBatch(
            forward_mode=mode, input_ids=t(ids), positions=t(pos), req_pool_indices=t(rpi),
            seq_lens=t([p + e for p, e in zip(prefix, ext)]), extend_prefix_lens=t(prefix), extend_seq_lens=t(ext),
            out_cache_loc=t(locs), logits_indices=t(logit_rows), logits_lens_cpu=logit_lens,
            req_to_token_pool=self.req_pool, token_to_kv_pool=self.kv_pool, attn_backend=self.backend,
            fast_prefill=fast_prefill, work=self.work,
        )

    def step(self, batch: list[tuple[str, list[int]]], all_logits: bool = False, fast_prefill: bool = False):
        fb = self.build(batch, all_logits, fast_prefill)
        out = self.model(fb)
        # what ModelRunner.forward counts
        self.work.count_forward(fb.forward_mode.is_extend, fb.num_tokens, int(out.logits.shape[0]), out.cross_decoder_rows,
                                out.fast_prefill)
        return out
