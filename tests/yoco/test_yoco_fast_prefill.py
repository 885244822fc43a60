"""The unit tests seed 000 names for PR-B (model-side YOCO branch), plus the per-prompt parity test.

1. test_select_rows_last_extend_token: extend lengths [3, 4, 2] -> LM-head rows [2, 6, 8]
2. test_cross_decoder_runs_only_selected_rows
3. test_scatter_keeps_self_decoder_rows
4. test_triton_back_half_metadata
5. test_per_prompt_parity (the per-prompt parity test; contracts PARITY-* cover 24 prompts)
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from impl import Engine
from impl.attention.triton_backend import TritonAttnBackend
from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
from impl.forward_batch import ForwardBatch, ForwardMode, last_rows
from impl.model import yoco
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


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


def test_cross_decoder_runs_only_selected_rows():
    eng = engine(True)
    model = eng.runner.model
    seen: dict[int, list[int]] = {}
    hooks = [
        layer.register_forward_hook(lambda mod, args, out, i=i: seen.setdefault(i, []).append(int(args[0].shape[0])))
        for i, layer in enumerate(model.layers)
    ]
    try:
        ps = _prompts([3, 4, 2, 20])
        eng.generate(input_ids=ps, sampling_params={"max_new_tokens": 1, "temperature": 0})
    finally:
        for h in hooks:
            h.remove()
    first_shared = model.config.first_kv_shared_layer
    assert first_shared == 15
    for i, rows in seen.items():
        want = sum(len(p) for p in ps) if i < first_shared else len(ps)
        assert rows == [want], f"layer {i} ran on {rows} rows, expected [{want}]"


def test_scatter_keeps_self_decoder_rows():
    full = torch.arange(9 * 4, dtype=torch.float32).reshape(9, 4)  # self-decoder output, 9 rows
    rows = torch.tensor([2, 6, 8])
    part = -torch.ones(3, 4)  # cross-decoder output of the gathered rows
    assert torch.equal(yoco.gather_rows(full, rows), full[[2, 6, 8]])
    out = yoco.scatter_rows(full, rows, part)
    assert torch.equal(out[rows], part)
    keep = [r for r in range(9) if r not in (2, 6, 8)]
    assert torch.equal(out[keep], full[keep])
    assert torch.equal(full, torch.arange(36, dtype=torch.float32).reshape(9, 4)), "scatter must not write into its input"


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
