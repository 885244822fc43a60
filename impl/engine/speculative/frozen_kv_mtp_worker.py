"""FROZEN_KV_MTP: one draft + verify round for every running request (SGLang's spec-v2 shape).

Seed: after a forward that samples a request's next token (its prefill, or a
verify), the request holds (bonus token = its last output token, which has no
K/V yet; ``spec_hidden`` = the target's final-normed hidden state of the row that
produced it). A round:

1. draft: the drafter proposes ``s`` chain tokens per request over the target's
   K/V (``s = steps``, less where ``max_new_tokens`` or the context would be
   overshot, so a round never commits past them);
2. verify: one target EXTEND forward over ``1 + s`` rows per request (bonus +
   drafts) at positions ``kv_len .. kv_len + s``; it writes their K/V and every row
   feeds the LM head (with fast prefill on, every verify row is a selected row, so
   the cross-decoder runs on all of them);
3. accept (``acceptance.py``): ``j`` drafts, ``j + 1`` committed tokens;
4. free the K/V of the rejected rows ``j + 1 .. s`` at once (``KVLifecycle.trim``);
   the new seed is the hidden state of row ``j`` (the last accepted row);
   constrained requests (a grammar) verify against the grammar's masks along the draft
   (``draft_masks``: the matcher advanced over the drafts, then rolled back), so a draft
   the grammar forbids is rejected;
5. commit the tokens through the scheduler's per-token path (``Scheduler.commit``: EOS,
   stop strings, ``max_new_tokens``, logprobs, streaming); a request that finishes
   midway drops the rest, and its release frees K/V past its last token.

The worker drives the scheduler through its public seam only (``base.py``): the draft
and the verify forward are fault-isolated there (a failing one fails the round's
requests, nothing else). Prefill batches run the normal scheduler path (without
decode rows: mixed chunked prefill is off under speculation); ``after_forward``
records each sampled request's seed hidden state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from impl.constrained.bitmask import allocate as allocate_bitmask
from impl.forward_batch import ForwardBatch, ForwardMode, RowSpan, WorkCounters, pack_forward_batch
from impl.engine.req import Req
from impl.engine.schedule_batch import ScheduleBatch
from impl.engine.speculative.acceptance import Accepted, accept_greedy_batch as accept_greedy, accept_sampled
from impl.engine.speculative.base import SchedulerSeam
from impl.engine.speculative.draft import Drafter
from impl.sampling.sampler import SampleRow

logger = logging.getLogger("impl.engine")


@dataclass
class SpecStats:
    """Totals since startup (Prometheus counters and ``avg_spec_accept_length``)."""

    verify_rounds: int = 0  # verify forwards
    verify_ct: int = 0  # request-verifies (one per request per round)
    verify_tokens: int = 0  # rows verified (bonus + drafts)
    draft_tokens: int = 0  # drafts proposed
    accepted_drafts: int = 0
    committed_tokens: int = 0  # tokens verifies committed (accepted drafts + one of the target's each)

    @property
    def avg_accept_length(self) -> float:
        return self.committed_tokens / self.verify_ct if self.verify_ct else 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__, avg_spec_accept_length=self.avg_accept_length)


@dataclass(frozen=True)
class SpecConfig:
    num_steps: int
    topk: int = 1
    num_draft_tokens: int = 0

    def describe(self) -> str:
        return (f"chain of {self.num_steps} draft tokens (steps {self.num_steps}, topk {self.topk}, "
                f"draft tokens {self.num_draft_tokens})")


class FrozenKVMTPWorker:
    def __init__(self, config: SpecConfig, drafter: Drafter, draft_name: str = "draft"):
        self.config = config
        self.drafter = drafter
        self.draft_name = draft_name
        self.stats = SpecStats()

    def describe(self) -> str:
        return (f"Speculative decoding: FROZEN_KV_MTP with draft {self.draft_name}, {self.config.describe()}; "
                "mixed chunked prefill off")

    def server_info(self) -> dict:
        c = self.config
        return {"algorithm": "FROZEN_KV_MTP", "draft_model": self.draft_name, "num_steps": c.num_steps,
                "eagle_topk": c.topk, "num_draft_tokens": c.num_draft_tokens, "mixed_chunked_prefill": False}

    # ---- seeds ---------------------------------------------------------------------
    def after_forward(self, batch: ScheduleBatch, hidden: torch.Tensor) -> None:
        """Record the seed hidden of every request this (prefill) forward sampled. hidden: [R, backbone]."""
        offset = 0
        for it in batch.items:
            offset += len(it.logits_rows)
            if it.samples:
                it.req.spec_hidden = hidden[offset - 1].detach().clone()

    # ---- one round -----------------------------------------------------------------
    def _steps_for(self, req: Req, sched: SchedulerSeam) -> int:
        """Drafts for ``req`` this round: never more than its remaining tokens allow."""
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        room = sched.config.max_req_len - req.seq_len
        return max(0, min(self.config.num_steps, left - 1, room))

    def run_round(self, sched: SchedulerSeam) -> None:
        """Draft, verify, accept and commit for every running request of scheduler ``sched``."""
        # Every request needs a slot for its bonus row (the scheduler retracts the newest while they do
        # not fit); drafts take what is left, oldest requests first.
        reqs = sched.make_room_for_decode()
        if not reqs:
            return
        spare = sched.kv.available() - len(reqs)
        steps = []
        for r in reqs:
            steps.append(min(self._steps_for(r, sched), spare))
            spare -= steps[-1]
        if max(steps) > 0:
            proposed = sched.run_isolated(reqs, lambda: self.drafter.draft(reqs, max(steps)))
            if proposed is None:  # the draft failed: the scheduler failed the round's requests
                return
        else:
            proposed = [[] for _ in reqs]
        drafts = [list(d[:s]) for d, s in zip(proposed, steps)]
        fb = self._verify_batch(sched, reqs, drafts)
        out = sched.run_forward(fb, reqs)
        if out is None:  # the verify failed: the scheduler failed the round's requests and freed their KV
            return
        assert out.hidden_states is not None, "the target's forward returns its final-normed hidden rows"
        self._commit(sched, reqs, drafts, out.logits, out.hidden_states)

    @staticmethod
    def _free_rejected(sched: SchedulerSeam, req: Req, keep: int) -> None:
        """Rows 0..j hold K/V of the bonus and the accepted drafts; rows j+1..s are rejected: free them now."""
        sched.kv.trim(req, keep)

    @staticmethod
    def _seed_row(offset: int, j: int) -> int:
        """The next seed: the hidden state of the last accepted row (the one that produced the new bonus)."""
        return offset + j

    @staticmethod
    def draft_masks(sched: SchedulerSeam, req: Req, drafts: list[int]) -> list[torch.Tensor | None] | None:
        """The grammar's mask for each verify row of ``req`` (row i: after drafts d_1 .. d_i), None without a
        grammar. The matcher walks the drafts while it accepts them and is rolled back to where it was; rows past
        a draft it refuses (or past its end) repeat the last mask: that draft is rejected, so they never count.
        A matcher that fails fails ``req`` alone."""
        g = req.grammar
        if g is None:
            return None
        masks: list[torch.Tensor | None] = []
        walked = 0
        try:
            bitmask = allocate_bitmask(len(drafts) + 1, g.vocab_size)
            for i in range(len(drafts) + 1):
                g.fill(bitmask, i)
                masks.append(bitmask[i])
                if i == len(drafts) or not g.accept(drafts[i]):
                    break
                walked += 1
                if g.is_terminated:  # the draft ended the grammar: nothing may follow it
                    break
            masks += [masks[-1]] * (len(drafts) + 1 - len(masks))
            g.rollback(walked)
        except Exception as e:  # noqa: BLE001 - fail this request only
            sched.fail_request(req, e, "grammar mask (speculative verify)")
            return None
        return masks

    @staticmethod
    def _verify_batch(sched: SchedulerSeam, reqs: list[Req], drafts: list[list[int]]) -> ForwardBatch:
        """EXTEND batch of ``1 + s`` rows per request (bonus + drafts), all of them LM-head rows."""
        spans = []
        for r, d in zip(reqs, drafts):
            start = r.kv_len
            slots = sched.kv.extend(r, 1 + len(d))
            assert slots is not None, "the round checked that the KV pool holds every verify row"
            spans.append(RowSpan(r.pool_idx, start, [r.output_ids[-1], *d], slots))
        rows = sum(sp.n for sp in spans)
        return pack_forward_batch(spans, sched.device, mode=ForwardMode.EXTEND, spec_verify=True,
                                  work=WorkCounters(decode_tokens=rows))

    def _commit(self, sched: SchedulerSeam, reqs: list[Req], drafts: list[list[int]], logits: torch.Tensor,
                hidden: torch.Tensor) -> None:
        eos = sched.config.eos_token_ids
        st = self.stats
        st.verify_rounds += 1
        starts = [0]
        for d in drafts:
            starts.append(starts[-1] + 1 + len(d))
        bases = [SampleRow(r.sampling_params, r.origin_input_ids, r.output_ids, r.generator, r.return_logprob,
                           r.top_logprobs_num) for r in reqs]
        masks = [self.draft_masks(sched, r, d) for r, d in zip(reqs, drafts)]
        greedy = [i for i, r in enumerate(reqs) if r.sampling_params.is_greedy and not r.is_finished]
        accepted: dict[int, Accepted] = {}
        if greedy:
            rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in greedy]).to(logits.device)
            for i, acc in zip(greedy, accept_greedy(logits.index_select(0, rows), [(bases[i], drafts[i]) for i in greedy], eos,
                                                    [masks[i] for i in greedy])):
                accepted[i] = acc
        for k, (r, d) in enumerate(zip(reqs, drafts)):
            if r.is_finished:  # its grammar failed (draft_masks failed it alone)
                continue
            n, offset = 1 + len(d), starts[k]
            acc = accepted[k] if k in accepted else accept_sampled(logits[offset : offset + n], bases[k], d, eos, masks[k])
            j = acc.num_accepted_drafts
            self._free_rejected(sched, r, r.kv_len - n + 1 + j)
            r.spec_hidden = hidden[self._seed_row(offset, j)].detach().clone()
            assert r.spec_verify_ct is not None, "the scheduler sets spec_verify_ct when it takes the request"
            r.spec_verify_ct += 1
            st.verify_ct += 1
            st.verify_tokens += n
            st.draft_tokens += len(d)
            st.accepted_drafts += j
            st.committed_tokens += sched.commit(r, acc.tokens, acc.logprobs, acc.top_logprobs, verified=True)
        sched.decode_step_done()
