"""The server's warm-up: one prompt the size of a prefill chunk, and a decode step, before the first request.

Why: the first large forward of a fresh process pays for what later ones reuse: the C library's arenas grow
to a chunk's working set (a page fault per 4 KB of every new buffer), the kernels' per-thread buffers are
allocated and first touched, oneDNN builds its primitives for the new row counts. On the AMX Xeon with
``--torchao-config int8dq`` the first 4 x 1024-token run of a fresh server gave 11.46 output tok/s against 13.17
for the run after it; with this warm-up 13.43 and 13.68 (bf16: 7.74 / 8.66 without, 8.82 / 8.42 with)
(``docs/benchmarks.md``, "The server warms up before its first request"). vLLM runs a dummy forward of its
largest batch while starting for the same reason; SGLang sends a short warm-up request
(``--skip-server-warmup`` skips it, here as there).

The warm-up runs on the scheduler's thread (its OpenMP team is the one requests use), leaves no trace a
client can see: its prompt is dropped from the radix cache, the work counters and decode-step times are
reset, it draws no seed from the engine's seed generator (so ``--random-seed`` gives the same samples as
without it), and the server's metrics never see it (it does not pass through the HTTP layer).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from impl.engine.engine import Engine

WARMUP_NEW_TOKENS = 2  # the prefill's token and one decode step
WARMUP_FIRST_ID = 6  # past the low special ids (pad, eos, bos, unk, ...)


def warmup_prompt(vocab_size: int, budget: int, max_req_len: int) -> list[int]:
    """Deterministic token ids: one prefill chunk (``budget``), shorter where a request may not be that long."""
    n = max(1, min(budget, max_req_len - WARMUP_NEW_TOKENS))
    rng = random.Random(0)
    lo = min(WARMUP_FIRST_ID, vocab_size - 1)
    return [rng.randrange(lo, vocab_size) for _ in range(n)]


def warm_up(engine: "Engine") -> str:
    """Run the warm-up request to its end on the background scheduler thread (started here), then clear what
    it left; the startup log line. RuntimeError when the request fails (the server must not start)."""
    cfg = engine.scheduler_config
    ids = warmup_prompt(int(cfg.vocab_size or engine.model_config.vocab_size), cfg.prefill_budget, cfg.max_req_len)
    sp = {"max_new_tokens": WARMUP_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True, "seed": 0}
    engine.start_background_loop()
    t = time.perf_counter()
    (req,) = engine.expand_requests([ids], sp, False, None, None, "server-warmup")
    (handle,) = engine.submit([req])
    while not handle.done.wait(0.05):
        if not engine.is_alive():
            raise RuntimeError("the scheduler thread stopped during the server warm-up; see the log above")
    out = handle.result()
    took = time.perf_counter() - t
    if out.finish_reason is not None and out.finish_reason.type == "abort":
        raise RuntimeError(f"the server warm-up request failed: {out.finish_reason.message}; "
                           "--skip-server-warmup starts without it")
    deadline = time.monotonic() + 30
    while not engine.flush_cache():  # the scheduler retires the finished request within its step
        if time.monotonic() > deadline:
            raise RuntimeError("the server warm-up request finished but the scheduler still holds work")
        time.sleep(0.01)
    engine.forget_warmup()
    return (f"Warm-up: one {len(ids)}-token prompt and {WARMUP_NEW_TOKENS - 1} decode step in {took:.1f} s "
            "(the first forward of a chunk's size grows the buffers later ones reuse; --skip-server-warmup skips it)")
