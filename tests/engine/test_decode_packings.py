"""Decode keeps each request's packed keys (AMX-bf16 or AVX512-BF16) from one step to the next (impl/kernels/cpu_attn, kv_generation)
only while no KV slot has been freed: the engine's outputs equal those of an engine that keeps nothing, also when
a finished request's slots go to the next request in the same order, where a kept packing of the old keys would
match the new request's slots."""

from __future__ import annotations

import pytest
import torch

import impl.cache.allocator as allocator
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.kernels import cpu_attn

pytestmark = [
    pytest.mark.slow,  # starts engines
    pytest.mark.skipif(cpu_attn.load() is None or not cpu_attn.kernel_isa()["decode"].startswith(("amx_bf16", "avx512_bf16")),
                       reason="decode keeps packings on bf16 pairs only (AMX-bf16 or AVX512-BF16: this CPU or build has none)"),
]

SLOTS = 30  # --max-total-tokens: requests of at most SLOTS - 1 tokens
PROMPT_A, NEW_A = 20, 9  # A writes K/V for 28 tokens (its last token writes none), in slots 1..28
PROMPT_B, NEW_B = 27, 2  # B's first decode step attends over 28 keys, as A's last did


def _run(keep: bool) -> list[dict]:
    from impl import Engine

    gen = torch.Generator().manual_seed(5)
    a = torch.randint(3, 400, (PROMPT_A,), generator=gen).tolist()
    b = torch.randint(3, 400, (PROMPT_B,), generator=gen).tolist()
    # No radix cache, one pool (every layer keeps its packings), e2b_bench_bf16 (head dim 32, the smallest the tiles
    # take). A leaves slots 29 and 30 at the head of the free list and frees its own behind them; a two-token prompt
    # without a decode step (an extend forward: no decode launch to drop what A kept) takes those two and frees them
    # behind A's, so B is handed A's slots in A's order.
    eng = Engine(tiny_checkpoint("e2b_bench_bf16"), max_total_tokens=SLOTS, disable_radix_cache=True,
                 disable_hybrid_swa_memory=True)
    try:
        eng.runner.decode_backend.keep_decode_packings = keep
        sp = {"temperature": 0, "ignore_eos": True}
        runs = [(a, NEW_A), ([5] * (SLOTS - (PROMPT_A + NEW_A - 1)), 1), (b, NEW_B)]
        return [eng.generate(input_ids=ids, sampling_params=dict(sp, max_new_tokens=n), return_logprob=True)
                for ids, n in runs]
    finally:
        eng.shutdown()


def _ids_and_logprobs(out: dict) -> tuple[list[int], list[float]]:
    return out["output_ids"], [x[0] for x in out["meta_info"]["output_token_logprobs"]]


def test_kept_packings_give_the_outputs_of_an_engine_that_keeps_none():
    kept, fresh = _run(True), _run(False)
    assert [_ids_and_logprobs(o) for o in kept] == [_ids_and_logprobs(o) for o in fresh]
    assert kept[0]["meta_info"]["completion_tokens"] == NEW_A and kept[-1]["meta_info"]["completion_tokens"] == NEW_B


def test_an_allocator_that_frees_without_moving_the_generation_is_caught(monkeypatch):
    """The mutant: frees leave the generation alone, so B's first decode step reads A's kept keys."""
    fresh = _run(False)
    monkeypatch.setattr(allocator, "_slots_freed", lambda: None)
    stale = _run(True)
    assert _ids_and_logprobs(stale[0]) == _ids_and_logprobs(fresh[0])  # A: nothing freed while it ran
    assert _ids_and_logprobs(stale[-1]) != _ids_and_logprobs(fresh[-1])


def test_what_decode_keeps_is_consistent_and_goes_with_the_engine():
    from impl import Engine

    eng = Engine(tiny_checkpoint("e2b_bench_bf16"), max_total_tokens=256, disable_hybrid_swa_memory=True)
    try:
        eng.generate(input_ids=[[7] * 40, [9] * 70], sampling_params={"max_new_tokens": 3, "ignore_eos": True})
        entries, nbytes = cpu_attn.kept_packings()  # the integrity check runs here
        assert entries > 0 and nbytes > 0  # both requests' packings from their last decode step (they finished since)
    finally:
        eng.shutdown()
    assert cpu_attn.kept_packings() == (0, 0)


def test_the_hybrid_pool_keeps_its_full_attention_layers_packings_through_window_evictions(monkeypatch):
    """The hybrid pool (the default for E2B): full-attention layers keep their packings; sliding layers read
    through the slot map and keep none, and their window evictions (sliding halves freed every 16 tokens here)
    leave the generation alone. Outputs equal those of an engine that keeps nothing."""
    from impl import Engine

    monkeypatch.setenv("YOCO_SWA_EVICTION_INTERVAL", "16")
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 400, (n,), generator=gen).tolist() for n in (150, 170)]
    sp = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    outs = {}
    for keep in (True, False):
        eng = Engine(tiny_checkpoint("e2b_bench_bf16"), max_total_tokens=1024, disable_radix_cache=True)
        try:
            eng.runner.decode_backend.keep_decode_packings = keep
            outs[keep] = [_ids_and_logprobs(o) for o in eng.generate(input_ids=prompts, sampling_params=sp,
                                                                      return_logprob=True)]
        finally:
            eng.shutdown()
    assert outs[True] == outs[False]
