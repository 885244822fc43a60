"""Mutants of the FROZEN_KV_MTP loop (issue 15): each breaks one rule of the speculative round."""

from __future__ import annotations

import torch

from contracts.mutants import mutant
from contracts.mutants.patching import PatchedSubject


@mutant("SPEC-GREEDY-PARITY")
class AcceptsOneDraftTooMany(PatchedSubject):
    """Greedy acceptance takes one draft past the matching prefix (then the target's token of the next row)."""

    def patches(self):
        from impl.engine.speculative.acceptance import Accepted, _rows
        from impl.sampling.sampler import sample

        def accept_one(logits, base, drafts, eos_ids, masks=None):
            out = sample(logits, _rows(base, drafts, masks), eos_ids)
            j = 0
            while j < len(drafts) and drafts[j] == out.token_ids[j]:
                j += 1
            j = min(j + 1, len(drafts))
            toks = list(drafts[:j]) + [out.token_ids[j]]
            return Accepted(toks, j, out.logprobs[: j + 1], out.top_logprobs[: j + 1])

        def accept(logits, reqs, eos_ids, masks=None):
            res, off = [], 0
            for k, (base, drafts) in enumerate(reqs):
                res.append(accept_one(logits[off : off + len(drafts) + 1], base, drafts, eos_ids,
                                      None if masks is None else masks[k]))
                off += len(drafts) + 1
            return res

        return {"impl.engine.speculative.frozen_kv_mtp_worker:accept_greedy": accept}


@mutant("SPEC-GREEDY-PARITY")
class SeedsFromWrongRow(PatchedSubject):
    """The next round is seeded from the hidden state of the row before the last accepted one."""

    PATCHES = {
        "impl.engine.speculative.frozen_kv_mtp_worker:FrozenKVMTPWorker._seed_row":
            staticmethod(lambda offset, j: offset + max(j - 1, 0)),
    }


@mutant("SPEC-KV-FREED")
class KeepsRejectedRowsKV(PatchedSubject):
    """Rejected draft rows are dropped from the request but their KV slots are never freed."""

    def patches(self):
        def keep(sched, req, kv_len):
            req.kv_len = max(kv_len, req.prefix_len)

        return {"impl.engine.speculative.frozen_kv_mtp_worker:FrozenKVMTPWorker._free_rejected": staticmethod(keep)}


@mutant("SPEC-FAST-PREFILL")
class VerifyRowsSkipCrossDecoder(PatchedSubject):
    """With fast prefill on, a verify batch's rows before each request's last keep the self-decoder's output, as if
    only the last row ran through the cross-decoder."""

    def patches(self):
        from impl.model.gemma4 import Gemma4ForCausalLM

        orig = Gemma4ForCausalLM.cross_decoder

        def cross_decoder(model, h, positions, ple, fb, rope=None):
            out = orig(model, h, positions, ple, fb, rope)
            if not (fb.fast_prefill and fb.spec_verify):
                return out
            keep = torch.ones(out.shape[0], dtype=torch.bool)
            keep[torch.tensor(fb.logits_lens_cpu).cumsum(0) - 1] = False  # each request's last selected row
            return torch.where(keep[:, None].to(out.device), h, out)

        return {"impl.model.gemma4:Gemma4ForCausalLM.cross_decoder": cross_decoder}


@mutant("SPEC-SAMPLING-DISTRIBUTION")
class RejectionResamplesFromTarget(PatchedSubject):
    """After rejecting a draft, the replacement is drawn from the target distribution itself, draft included
    (the residual max(p - q, 0) is not formed), which over-weights the draft's token."""

    PATCHES = {"impl.engine.speculative.acceptance:rejection_residual": lambda p, draft: p.clone()}
