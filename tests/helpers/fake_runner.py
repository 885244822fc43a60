"""A model-free runner for scheduler tests: logits are a pure function of the context.

The "KV cache" stores each row's token id at its slot; a row's logits are drawn
from a generator seeded by the token ids it reads back through
``req_to_token`` (positions 0..p). A wrong prefix-cache mapping, a chunk
boundary error or a stale slot changes the context, hence the tokens.
"""

from __future__ import annotations

import hashlib

import torch

from impl.cache.allocator import TokenSlotAllocator
from impl.cache.kv_pool import ReqToTokenPool
from impl.cache.radix_cache import RadixCache
from impl.forward_batch import ForwardBatch, WorkCounters
from impl.model.outputs import LogitsOutput
from impl.engine.intake import IntakePolicy, validate_req
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import Req
from impl.engine.scheduler import Scheduler
from impl.engine.scheduler_config import SchedulerConfig
from impl.sampling.sampling_params import SamplingParams

VOCAB = 16


def context_logits(tokens: list[int]) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(str(tokens).encode()).digest()[:7], "little")
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


class FakeRunner:
    def __init__(self, capacity: int, max_running: int, max_len: int):
        self.device = torch.device("cpu")
        self.token_store = torch.full((capacity,), -1, dtype=torch.int64)
        self.req_to_token_pool = ReqToTokenPool(max_running, max_len + 1)
        self.token_to_kv_pool = None
        self.work = WorkCounters()
        self.batches: list[tuple[str, list[int]]] = []

    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        assert int(fb.out_cache_loc.min()) >= 1, "a row writes the pad slot"
        self.token_store[fb.out_cache_loc] = fb.input_ids
        self.batches.append((fb.forward_mode.value, list(fb.extend_seq_lens_cpu)))
        for k, v in fb.work.as_dict().items():
            setattr(self.work, k, getattr(self.work, k) + v)
        rows = []
        starts = fb.extend_start_loc_cpu
        li = fb.logits_indices.tolist()
        k = 0
        for i, n in enumerate(fb.logits_lens_cpu):
            idx = int(fb.req_pool_indices[i])
            for r in li[k : k + n]:
                assert starts[i] <= r < starts[i] + fb.extend_seq_lens_cpu[i], "logits row outside its request"
                p = fb.extend_prefix_lens_cpu[i] + (r - starts[i])
                ctx = self.token_store[self.req_to_token_pool.req_to_token[idx, : p + 1]].tolist()
                assert -1 not in ctx, "a row reads a slot nobody wrote"
                rows.append(context_logits(ctx))
            k += n
        return LogitsOutput(logits=torch.stack(rows))


def make_scheduler(total_tokens=512, chunk=-1, radix=True, max_running=16, max_len=128, max_prefill=4096, eos=(1,)):
    cap = total_tokens + 1
    runner = FakeRunner(cap, max_running, max_len)
    alloc = TokenSlotAllocator(cap)
    kv = KVLifecycle(alloc, runner.req_to_token_pool, RadixCache(alloc) if radix else None)
    cfg = SchedulerConfig(
        max_running_requests=max_running, chunked_prefill_size=chunk, max_prefill_tokens=max_prefill,
        max_req_len=min(max_len, total_tokens), eos_token_ids=tuple(eos), vocab_size=VOCAB,
    )
    return Scheduler(cfg, runner, kv)


def make_req(rid, ids, seed=0, **kw) -> Req:
    lp = {k: kw.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "input_token_ranks",
                                    "cache_namespace")
          if k in kw}
    kw.setdefault("temperature", 0.0)
    return Req(rid, list(ids), SamplingParams.from_dict(kw), generator=torch.Generator().manual_seed(seed), **lp)


def run(sched: Scheduler, reqs: list[Req], max_steps: int = 10_000) -> list[Req]:
    for r in reqs:
        validate_req(r, IntakePolicy(sched.config.max_req_len, sched.config.vocab_size))
        sched.add_request(r)
    steps = 0
    while sched.has_work:
        sched.step()
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
        if steps % 7 == 0:
            sched.check_integrity()
    sched.check_integrity()
    return reqs
