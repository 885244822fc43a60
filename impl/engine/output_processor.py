"""A forward's results, request by request: prompt logprobs, sampling, and the per-token path.

The per-token path (``commit``) is the one way a token joins a request, for the one-token decode step and
for a speculative round alike: output and logprobs grow, then ``max_new_tokens``, EOS and stop tokens, the
context length and stop strings are checked; a finished request releases its KV and gets its final output;
an unfinished one streams every ``stream_interval`` tokens. A failure here fails its request only
(``fault_isolation.py``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from impl.constrained.bitmask import allocate as allocate_bitmask
from impl.engine.fault_isolation import FaultIsolation
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.req import FinishReason, Req
from impl.engine.req_queues import ReqQueues
from impl.engine.schedule_batch import BatchItem, ScheduleBatch
from impl.engine.scheduler_config import SchedulerConfig
from impl.sampling.sampler import SampleRow, sample


# Prompt-logprob rows handled at once: a block's log-softmax (and rank comparison) over the vocabulary is its
# temporary, [256, 262144] float32 = 256 MiB at Gemma-4's vocabulary, whatever the chunk's row count.
PROMPT_LOGPROB_BLOCK = 256


class OutputProcessor:
    def __init__(self, config: SchedulerConfig, queues: ReqQueues, kv: KVLifecycle, faults: FaultIsolation):
        self.config = config
        self.queues = queues
        self.kv = kv
        self.faults = faults

    def process(self, batch: ScheduleBatch, logits: torch.Tensor) -> None:
        """logits: [R, V] float32, rows in batch order (``logits_rows`` of each item)."""
        offset = 0
        to_sample: list[BatchItem] = []
        last_rows: list[int] = []
        for it in batch.items:
            k = len(it.logits_rows)
            try:
                self._prompt_logprobs(it, logits[offset : offset + k])
            except Exception as e:  # noqa: BLE001 - fail this request only
                self.faults.fail_request(it.req, e, "prompt logprob assembly")
            if it.samples and not it.req.is_finished:
                to_sample.append(it)
                last_rows.append(offset + k - 1)
            offset += k
        if to_sample:
            self._sample_and_commit(to_sample, logits[last_rows])
        q = self.queues
        for it in batch.items:  # requests that finished their prefill join the running ones
            r = it.req
            if r in q.prefilling:
                q.prefilling.remove(r)
            if it.samples and not r.is_finished and r not in q.running:
                q.running.append(r)

    def _sample_and_commit(self, items: list[BatchItem], logits: torch.Tensor) -> None:
        """logits: [len(items), V], each item's last row."""
        reqs = [it.req for it in items]
        rows = [
            SampleRow(
                params=r.sampling_params, prompt_ids=r.origin_input_ids, output_ids=r.output_ids,
                generator=r.generator, return_logprob=r.return_logprob,
                top_logprobs_num=r.top_logprobs_num, token_bitmask=mask,
            )
            for r, mask in zip(reqs, self.grammar_masks(reqs))
        ]
        picked = self.faults.sample_isolated(sample, logits, rows, reqs, self.config.eos_token_ids)
        for r, res in zip(reqs, picked):
            if res is not None and not r.is_finished:
                self.commit(r, [res[0]], [res[1]], [res[2]])

    def grammar_masks(self, reqs: Sequence[Req]) -> list[torch.Tensor | None]:
        """Each constrained request's allowed next tokens (a bitmask row, ``impl/constrained``), None for the
        others; a request whose matcher fails is failed here, alone."""
        masks: list[torch.Tensor | None] = [None] * len(reqs)
        idx = [j for j, r in enumerate(reqs) if r.grammar is not None and not r.is_finished]
        if not idx:
            return masks
        bitmask = allocate_bitmask(len(idx), max(reqs[j].grammar.vocab_size for j in idx))
        for k, j in enumerate(idx):
            try:
                reqs[j].grammar.fill(bitmask, k)
                masks[j] = bitmask[k]
            except Exception as e:  # noqa: BLE001 - fail this request only
                self.faults.fail_request(reqs[j], e, "grammar mask")
        return masks

    def _prompt_logprobs(self, it: BatchItem, rows: torch.Tensor) -> None:
        req = it.req
        want = [(j, it.start + o) for j, o in enumerate(it.logits_rows) if req.input_logprob_next_pos <= it.start + o
                < len(req.origin_input_ids) - 1]
        for b in range(0, len(want), PROMPT_LOGPROB_BLOCK):  # the [rows, V] temporaries stay a block's
            block = want[b : b + PROMPT_LOGPROB_BLOCK]
            lp = torch.log_softmax(rows[[j for j, _ in block]].float(), dim=-1)  # [w, V]
            toks = [req.origin_input_ids[p + 1] for _, p in block]
            own = lp.gather(1, torch.tensor(toks)[:, None])  # [w, 1]
            if req.input_token_ranks is not None:  # rank: how many tokens are at least as likely (vLLM's count)
                req.input_token_ranks.extend((lp >= own).sum(1).tolist())
            tops = None
            if req.top_logprobs_num > 0:
                v, idx = torch.topk(lp, min(req.top_logprobs_num, lp.shape[-1]), dim=-1)
                tops = [list(zip(vr, ir)) for vr, ir in zip(v.tolist(), idx.tolist())]
            for i, ((_, p), tok, lp_tok) in enumerate(zip(block, toks, own[:, 0].tolist())):
                req.input_token_logprobs.append((lp_tok, tok))
                req.input_top_logprobs.append(None if tops is None else tops[i])
                req.input_logprob_next_pos = p + 1

    # ---- the per-token path ---------------------------------------------------------------------
    def commit(self, req: Req, tokens: Sequence[int], logprobs: Sequence[float | None] | None = None,
               top_logprobs: Sequence[Any] | None = None, *, verified: bool = False) -> int:
        """Append ``tokens``, the model's next tokens for ``req`` in order, one at a time through the
        per-token path; the first token that finishes ``req`` ends the commit (the rest are dropped, its KV
        released). Then ``req`` streams its progress (every ``stream_interval`` tokens). A failure here fails
        ``req`` only. ``logprobs`` / ``top_logprobs``: one entry per token (None: not wanted). ``verified``:
        the tokens come from a speculative verify; each counts in ``req.spec_committed_tokens`` before it is
        appended, so the final output of a finishing token carries the count. Returns the number of tokens
        appended."""
        before = len(req.output_ids)
        now = time.perf_counter()
        try:
            for i, tok in enumerate(tokens):
                if req.is_finished:
                    break
                if verified:
                    req.spec_committed_tokens += 1
                self._append_token(req, tok, None if logprobs is None else logprobs[i],
                                   None if top_logprobs is None else top_logprobs[i], now)
        except Exception as e:  # noqa: BLE001 - fail this request only
            self.faults.fail_request(req, e, "token bookkeeping and stop checking")
        self._emit_progress(req)
        return len(req.output_ids) - before

    def _emit_progress(self, req: Req) -> None:
        """Stream progress: an unfinished request with ``stream_interval`` new tokens since its last emit."""
        if not req.is_finished and req.on_output is not None:
            if len(req.output_ids) - req.last_emitted_len >= self.config.stream_interval:
                req.last_emitted_len = len(req.output_ids)
                self.faults.emit(req)

    def _append_token(self, req: Req, tok: int, logprob, top, now: float) -> None:
        sp = req.sampling_params
        if sp.max_new_tokens == 0:  # prefill only (e.g. prompt logprobs): nothing is generated
            self._release_and_finish(req, FinishReason("length", length=0))
            return
        req.append_output(tok)
        if req.first_token_time is None:
            req.first_token_time = now
        if req.return_logprob:
            req.output_token_logprobs.append((logprob, tok))
            req.output_top_logprobs.append(top)
        if sp.stop:  # this thread owns the detokenizer of a request with stop strings
            req.detok.step((tok,))
        if req.grammar is not None and not req.grammar.accept(tok):
            raise ValueError(f"token {tok} is not allowed by the request's {req.grammar.key.kind} grammar")
        reason = self._check_finished(req, tok)
        if reason is not None:
            self._release_and_finish(req, reason)

    def _check_finished(self, req: Req, tok: int) -> FinishReason | None:
        sp = req.sampling_params
        n = len(req.output_ids)
        if req.grammar is not None and req.grammar.is_terminated:  # the grammar completed with a stop token
            return FinishReason("stop", matched=tok)
        if n >= sp.max_new_tokens:
            return FinishReason("length", length=sp.max_new_tokens)
        if n >= sp.min_new_tokens:
            if tok in sp.stop_token_ids or (not sp.ignore_eos and tok in self.config.eos_token_ids):
                return FinishReason("stop", matched=tok)
        if req.seq_len >= self.config.max_req_len:
            return FinishReason("length", length=n)
        if sp.stop and n >= sp.min_new_tokens:
            # only the new text plus the longest stop string's tail can hold a new match
            text = req.detok.text
            lo = max(0, req.stop_checked_chars - max(len(s) for s in sp.stop) + 1)
            hits = [(pos, s) for s in sp.stop if (pos := text.find(s, lo)) >= 0]
            req.stop_checked_chars = len(text)
            if hits:
                pos, s = min(hits)
                req.stop_text_pos = pos
                return FinishReason("stop", matched=s)
        return None

    def _release_and_finish(self, req: Req, reason: FinishReason) -> None:
        self.queues.remove(req)
        self.kv.release(req)
        self.faults.finish(req, reason)
