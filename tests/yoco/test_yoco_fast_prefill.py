"""The unit tests seed 000 names for PR-B (model-side YOCO branch), plus the per-prompt parity test.

1. test_select_rows_last_extend_token: extend lengths [3, 4, 2] -> LM-head rows [2, 6, 8]
2. test_cross_decoder_runs_only_selected_rows (and the last self-decoder layer past its K/V)
3. test_cut_layer_writes_every_rows_kv (the PR's scatter: our model projects only the selected rows, so there is
   nothing to scatter back; what the rows it skips must still get is their K/V)
4. test_triton_back_half_metadata
5. test_per_prompt_parity (the per-prompt parity test; contracts PARITY-* cover 24 prompts)
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from impl import Engine
from impl.attention.torch_native import TorchNativeAttnBackend
from impl.attention.triton_backend import TritonAttnBackend
from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from impl.forward_batch import ForwardBatch, ForwardMode, last_rows
from impl.model import yoco
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.session import Session


@functools.lru_cache(maxsize=None)
def engine(fast: bool) -> Engine:
    return Engine(
        model_path=tiny_checkpoint("e2b"), attention_backend="triton", decode_attention_backend="torch_native",
        kv_sharing_fast_prefill=fast, disable_radix_cache=True,
    )


def _prompts(lengths, seed=11):
    rng = random.Random(seed)
    return [[rng.randrange(8, 512) for _ in range(n)] for n in lengths]


def _batch(prefix, ext, req_rows, pool: ReqToTokenPool, logits_rows=None, logits_lens=None) -> ForwardBatch:
    """A packed batch whose request b has prefix[b] cached tokens and ext[b] new ones (slots laid out in order)."""
    ids, pos, locs, next_slot = [], [], [], 1
    for b, (p, e) in enumerate(zip(prefix, ext)):
        slots = torch.arange(next_slot, next_slot + p + e)
        next_slot += p + e
        pool.req_to_token[req_rows[b], : p + e] = slots
        ids += [10 + b] * e
        pos += list(range(p, p + e))
        locs += slots[p:].tolist()
    rows = logits_rows if logits_rows is not None else last_rows(ext)
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, input_ids=t(ids), positions=t(pos), req_pool_indices=t(req_rows),
        seq_lens=t([p + e for p, e in zip(prefix, ext)]), extend_prefix_lens=t(prefix), extend_seq_lens=t(ext),
        out_cache_loc=t(locs), logits_indices=t(rows), logits_lens_cpu=logits_lens or [1] * len(ext),
    )


def test_select_rows_last_extend_token():
    assert last_rows([3, 4, 2]) == [2, 6, 8]
    pool = ReqToTokenPool(4, 64, "cpu")
    fb = _batch([0, 0, 0], [3, 4, 2], [0, 1, 2], pool)
    assert yoco.select_rows(fb).tolist() == [2, 6, 8]
    assert fb.last_row_indices_cpu == [2, 6, 8]
    # Pure decode batches take the normal path; one multi-token extend switches fast prefill on.
    assert not yoco.applies(True, [1, 1, 1]) and yoco.applies(True, [1, 5, 1]) and not yoco.applies(False, [3, 4])


def _layer_rows(model, monkeypatch) -> dict[int, list[tuple[int, int]]]:
    """layer index -> (rows in, rows out) of each call: every layer's forward wrapped (the model calls
    ``layer.forward`` itself, so module hooks would not see it)."""
    seen: dict[int, list[tuple[int, int]]] = {}
    for i, layer in enumerate(model.layers):
        def spy(h, *args, _inner=layer.forward, _i=i, **kwargs):
            out = _inner(h, *args, **kwargs)
            seen.setdefault(_i, []).append((int(h.shape[0]), int(out.shape[0])))
            return out
        monkeypatch.setattr(layer, "forward", spy)
    return seen


def test_cross_decoder_runs_only_selected_rows(monkeypatch):
    """The KV-shared layers run the LM-head rows only; so does the last self-decoder layer past its K/V (it takes
    every row and returns the selected ones)."""
    model = engine(True).runner.model
    seen = _layer_rows(model, monkeypatch)
    ps = _prompts([3, 4, 2, 20])
    engine(True).generate(input_ids=ps, sampling_params={"max_new_tokens": 1, "temperature": 0})
    first_shared, t = model.config.first_kv_shared_layer, sum(len(p) for p in ps)
    assert first_shared == 15 and sorted(seen) == list(range(model.config.num_hidden_layers))
    for i, calls in seen.items():
        want = (t, t) if i < first_shared - 1 else (t, len(ps)) if i == first_shared - 1 else (len(ps), len(ps))
        assert calls == [want], f"layer {i} ran (rows in, rows out) {calls}, expected [{want}]"


@pytest.mark.parametrize("backend_cls", [TritonAttnBackend, TorchNativeAttnBackend], ids=["triton", "torch_native"])
def test_cut_layer_writes_every_rows_kv(backend_cls):
    """The last self-decoder layer computes only the LM-head rows with the flag, but writes every row's K/V: the
    pool holds the same K/V after a prefill with the flag as without it (so later chunks and decode steps read
    the same keys), and the logits agree."""
    model = engine(False).runner.model
    batch = [(f"r{i}", p) for i, p in enumerate(_prompts([9, 4, 30]))]
    t, layer = sum(len(p) for _, p in batch), model.config.first_kv_shared_layer - 1
    runs = []
    for fast in (False, True):
        s = Session(model, backend_cls=backend_cls)
        out = s.step(batch, fast_prefill=fast)
        k, v = s.kv_pool.get_kv_buffer(layer)
        runs.append((out.logits, k[1 : 1 + t].clone(), v[1 : 1 + t].clone()))  # Session's slots: 1, 2, ... in order
    (ref_logits, ref_k, ref_v), (logits, k, v) = runs
    assert torch.equal(ref_k, k) and torch.equal(ref_v, v) and ref_k.abs().sum() > 0
    assert (ref_logits - logits).abs().max().item() <= 1e-5


def test_triton_back_half_metadata():
    cfg = engine(False).model_config
    kv = TokenToKVPool(cfg, 256, torch.float32, "cpu")
    pool = ReqToTokenPool(4, 128, "cpu")
    # request 0: 5 cached + 3 new tokens, LM-head row = its last; request 1: fresh 6 tokens with
    # prompt logprobs from token 3 (rows 2..5 of its extend feed the LM head).
    fb = _batch([5, 0], [3, 6], [1, 3], pool, logits_rows=[2, 5, 6, 7, 8], logits_lens=[1, 4])
    be = TritonAttnBackend(cfg, kv, pool, "cpu")
    be.init_forward_metadata(fb)
    before = [b.clone() for b in kv.get_kv_buffer(0)]
    rows = torch.tensor([2, 5, 6, 7, 8])
    be.init_cross_decoder_metadata(fb, rows, [1, 4])
    md = be.cross_metadata
    assert md.qo_indptr.tolist() == [0, 1, 5]  # only the selected rows are queries
    assert md.q_positions.tolist() == [7, 2, 3, 4, 5]  # each keeps its absolute position
    assert md.kv_indptr.tolist() == [0, 8, 14]  # keys: the FULL context, prefix included
    assert md.kv_indices.tolist() == pool.req_to_token[1, :8].tolist() + pool.req_to_token[3, :6].tolist()
    assert all(torch.equal(a, b) for a, b in zip(before, kv.get_kv_buffer(0))), "building metadata writes no KV"


def test_a_lone_lm_head_row_is_one_unsplit_decode_query():
    """One selected row is the decode kernel's one query over its request's whole context, unsplit (its keys summed in
    the extend kernel's order, as flag off sums them). That its matmuls get two rows (oneDNN's one-row kernel rounds
    unlike its multi-row one) is the CPU linear route's business: cpu_fused.transform.FusedLayerForward."""
    cfg = engine(False).model_config
    kv = TokenToKVPool(cfg, 256, torch.float32, "cpu")
    pool = ReqToTokenPool(4, 128, "cpu")
    fb = _batch([5], [3], [1], pool, logits_rows=[2], logits_lens=[1])
    be = TritonAttnBackend(cfg, kv, pool, "cpu")
    be.init_forward_metadata(fb)
    be.init_cross_decoder_metadata(fb, torch.tensor([2]), [1])
    md = be.cross_metadata
    assert md.use_decode_kernel and md.qo_indptr.tolist() == [0, 1] and md.q_positions.tolist() == [7]
    assert md.kv_indptr.tolist() == [0, 8] and md.kv_indices.tolist() == pool.req_to_token[1, :8].tolist()
    assert md.num_kv_splits.tolist() == [1]  # unsplit


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_per_prompt_parity(batched):
    ps = _prompts([1, 5, 16, 17, 33, 50])
    sp = {"max_new_tokens": 4, "temperature": 0}
    outs = {}
    for fast in (False, True):
        if batched:
            res = engine(fast).generate(input_ids=ps, sampling_params=sp, return_logprob=True)
        else:
            res = [engine(fast).generate(input_ids=p, sampling_params=sp, return_logprob=True) for p in ps]
        outs[fast] = res
    for i, (off, on) in enumerate(zip(outs[False], outs[True])):
        assert on["output_ids"] == off["output_ids"], f"prompt {i} (len {len(ps[i])})"
        lp_off = [x[0] for x in off["meta_info"]["output_token_logprobs"]]
        lp_on = [x[0] for x in on["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(lp_off, lp_on)) < 1e-4
    assert engine(True).work_counters()["fast_prefill_forwards"] >= 1
