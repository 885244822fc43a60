"""impl/engine/warmup.py: the server warms up with one chunk-sized prompt before its first request, says so in
the startup log, and leaves nothing a client can see: no cached prefix, counters from zero, the same samples
under --random-seed as a server that skipped it."""

from __future__ import annotations

from impl.args.server_args import ServerArgs
from impl.engine.warmup import WARMUP_NEW_TOKENS, warmup_prompt
from impl.models_builtin import default_model_path
from impl.server.runtime import build_engine

SAMPLED = {"max_new_tokens": 6, "temperature": 1.0, "top_k": 50}


def test_the_prompt_is_a_chunk_within_the_request_length():
    ids = warmup_prompt(vocab_size=1000, budget=2048, max_req_len=10_000)
    assert len(ids) == 2048 and min(ids) >= 6 and max(ids) < 1000
    assert ids == warmup_prompt(1000, 2048, 10_000)  # deterministic
    assert len(warmup_prompt(1000, 2048, 300)) == 300 - WARMUP_NEW_TOKENS
    assert len(warmup_prompt(4, 16, 2)) == 1 and warmup_prompt(4, 16, 2)[0] == 3


def _served(skip: bool) -> tuple[list[str], dict, list[list[int]]]:
    args = ServerArgs(model_path=default_model_path(), random_seed=7, skip_server_warmup=skip,
                      chunked_prefill_size=64)
    eng = build_engine(args)
    try:
        info = eng.get_server_info()
        log = [line for line in info["startup_log"] if line.startswith("Warm-up")]
        before = (info["work_counters"], info["decode_step_times"]["steps"])
        cfg = eng.scheduler_config
        warm = warmup_prompt(cfg.vocab_size, cfg.prefill_budget, cfg.max_req_len)
        outs = eng.generate(input_ids=[warm[:20], [2, 13, 14]], sampling_params=SAMPLED)
        assert outs[0]["meta_info"]["cached_tokens"] == 0  # the warm-up's prompt left the radix cache
        return log, {"counters": before[0], "decode_steps": before[1]}, [o["output_ids"] for o in outs]
    finally:
        eng.shutdown()


def test_warm_up_leaves_no_trace_and_skip_skips_it():
    log, state, ids = _served(skip=False)
    assert len(log) == 1 and log[0].startswith("Warm-up: one 64-token prompt and 1 decode step in "), log
    assert state["decode_steps"] == 0 and all(v == 0 for v in state["counters"].values()), state
    skipped_log, _, skipped_ids = _served(skip=True)
    assert skipped_log == []
    assert ids == skipped_ids  # no seed drawn, no cached prefix: the same samples
