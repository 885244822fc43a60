"""YOCO fast prefill: the cross-decoder on the LM-head rows only gives the same logits, and does less work."""

from __future__ import annotations

import torch

from contracts.mutants.engine_mutants import attend_writing_selected_kv
from impl.model import yoco
from tests.helpers.model import ours, prompt
from tests.helpers.session import Session

# Same model, same float32 ops on the selected rows; only attention batching differs.
TOL = 1e-5


def _run(model, batches, fast: bool, all_logits: bool = False):
    s = Session(model)
    outs = [s.step(b, all_logits=all_logits, fast_prefill=fast) for b in batches]
    return outs, s.work


def _assert_same(model, batches, all_logits=False):
    ref, _ = _run(model, batches, fast=False, all_logits=all_logits)
    got, work = _run(model, batches, fast=True, all_logits=all_logits)
    for r, g in zip(ref, got):
        assert r.logits.shape == g.logits.shape
        assert (r.logits - g.logits).abs().max().item() <= TOL
        assert (r.hidden_states - g.hidden_states).abs().max().item() <= TOL
    return work


def test_fast_prefill_same_logits_new_prompts(shared_config_name):
    model = ours(shared_config_name)
    prompts = [prompt(n, 50 + n) for n in (3, 40, 1, 17)]
    work = _assert_same(model, [[(f"r{i}", p) for i, p in enumerate(prompts)]])
    t = sum(map(len, prompts))
    assert work.self_decoder_rows == t
    assert work.cross_decoder_rows == len(prompts)  # one selected row per request
    assert work.skipped_cross_decoder_rows == t - len(prompts)
    assert work.lm_head_rows == len(prompts) and work.fast_prefill_forwards == 1


def test_fast_prefill_same_logits_with_cached_prefix(shared_config_name):
    """Second chunk of a request (its prefix already in the pool) beside a fresh prompt and a decode step."""
    model = ours(shared_config_name)
    a, b, c = prompt(45, 61), prompt(9, 62), prompt(30, 63)
    _assert_same(model, [[("a", a[:20]), ("c", c)], [("a", a[20:]), ("b", b), ("c", [5])]])


def test_fast_prefill_all_rows_for_prompt_logprobs(shared_config_name):
    model = ours(shared_config_name)
    work = _assert_same(model, [[("a", prompt(25, 71)), ("b", prompt(4, 72))]], all_logits=True)
    assert work.cross_decoder_rows == 29 and work.skipped_cross_decoder_rows == 0


def test_normal_path_counts_every_row():
    model = ours("e2b")
    _, work = _run(model, [[("a", prompt(12, 80))], [("a", [7])]], fast=False)
    assert work.forwards == 2 and work.extend_forwards == 1 and work.fast_prefill_forwards == 0
    assert work.self_decoder_rows == 13 and work.cross_decoder_rows == 13 and work.lm_head_rows == 2


def test_gather_rows():
    x = torch.arange(12.0).view(6, 2)
    part = yoco.gather_rows(x, torch.tensor([2, 5]))
    assert part.tolist() == [[4.0, 5.0], [10.0, 11.0]]
    part.zero_()
    assert x[2].tolist() == [4.0, 5.0], "the gathered rows are a copy"


def test_gather_first_token_mutant_is_caught(monkeypatch):
    """A gather that picks each request's first row instead of its last changes the logits."""
    model = ours("e2b")
    batch = [[("a", prompt(20, 90)), ("b", prompt(7, 91))]]
    ref, _ = _run(model, batch, fast=False)
    monkeypatch.setattr(yoco, "select_rows", lambda fb: torch.tensor(fb.extend_start_loc_cpu, dtype=torch.int64))
    got, _ = _run(model, batch, fast=True)
    assert (ref[0].logits - got[0].logits).abs().max().item() > 1e-2


def test_cut_layer_writing_only_selected_kv_mutant_is_caught(monkeypatch):
    """The last self-decoder layer must write every row's K/V though it computes only the LM-head rows: writing
    just theirs leaves stale keys that its own attention and the next chunk read."""
    model = ours("e2b")
    batch = [[("a", prompt(20, 92)), ("b", prompt(7, 93))], [("a", prompt(5, 94))]]
    ref, _ = _run(model, batch, fast=False)
    monkeypatch.setattr(yoco, "attend", attend_writing_selected_kv)
    got, _ = _run(model, batch, fast=True)
    assert max((r.logits - g.logits).abs().max().item() for r, g in zip(ref, got)) > 1e-2
