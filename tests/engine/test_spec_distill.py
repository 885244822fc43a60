"""The distillation's dense, differentiable draft step equals the serving assistant's step over the pool."""

from __future__ import annotations

import pytest
import torch

from impl.forward_batch import pack_forward_batch
from impl.model.assistant import draft_span
from impl.model.loader import load_model
from impl.checkpoint_factory import distill
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


def test_dense_draft_step_equals_the_assistant_over_the_target_pool():
    target = load_model(tiny_checkpoint("e2b"))
    draft = load_model(tiny_checkpoint("assistant"))
    draft.attach_target(target)
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(8, 500, (40,), generator=g).tolist()
    tr = distill.target_traces(target, draft.config, [seq], [0])[0]
    # seed rows p (shorter than and beyond the sliding window 16), bonus x[p+1]
    ps = torch.tensor([3, 15, 16, 30])
    P = {k: v for k, v in draft.state_dict().items()}
    kv = {lt: (k[None], v[None]) for lt, (k, v) in tr.kv.items()}
    for p in ps.tolist():
        pos = torch.tensor([[p]])
        dense_logits, dense_hidden = distill.draft_forward(
            P, draft.config, tr.embeds[p + 1][None, None], tr.hidden[p][None, None], pos, kv,
            distill.query_masks(draft.config, pos, _prefix(len(seq), p)),
        )
        # the serving path: the request holds K/V of tokens 0..p in a pool
        from impl.attention.torch_native import TorchNativeAttnBackend
        from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool

        kv_pool = TokenToKVPool(target.config, 64, torch.float32, "cpu")
        req_pool = ReqToTokenPool(1, 64, "cpu")
        backend = TorchNativeAttnBackend(target.config, kv_pool, req_pool, "cpu")
        row = req_pool.alloc()
        slots = torch.arange(1, p + 2)
        req_pool.req_to_token[row, : p + 1] = slots
        for lt, (k, v) in tr.kv.items():
            layer = distill.producer_of(draft.config, target.config, lt)
            kv_pool.set_kv_buffer(layer, slots, k[: p + 1].reshape(p + 1, -1), v[: p + 1].reshape(p + 1, -1))
        fb = pack_forward_batch([draft_span(row, p + 1, int(seq[p + 1]))], "cpu", req_to_token_pool=req_pool,
                                token_to_kv_pool=kv_pool, attn_backend=backend)
        out = draft(fb, tr.hidden[p][None])
        assert (out.logits - dense_logits[0]).abs().max() < 1e-4, p
        assert (out.hidden_states - dense_hidden[0]).abs().max() < 1e-4, p


def _prefix(length: int, p: int) -> torch.Tensor:
    m = torch.zeros(1, length, dtype=torch.bool)
    m[0, : p + 1] = True
    return m


@pytest.mark.slow  # trains a draft model
def test_distilled_checkpoint_is_an_assistant_for_e2b():
    target = load_model(tiny_checkpoint("e2b"))
    draft = load_model(tiny_checkpoint("assistant_distilled"))
    draft.attach_target(target)
    init = load_model(tiny_checkpoint("assistant"))
    assert not torch.equal(draft.pre_projection.weight, init.pre_projection.weight)  # trained, not the random init
