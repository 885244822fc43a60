"""SGLang's generation control on an Engine: pause / continue, and new weights from disk.

Both act between two scheduler steps (the engine's ``StepLock.control``), so no forward sees a half-done change.

``pause(engine, mode)``: from then on the engine's steps run no forward (``Engine.step`` only applies the inbox:
new requests wait in the queue, aborts apply) until ``Engine.continue_generation``. ``abort``: every request in
flight is aborted (finish_reason abort); ``retract``: the running requests go back to the waiting queue, their KV
freed (into the radix cache when it is on), prefilled again after; ``in_place``: they keep their KV and resume
where they were.

``update_weights(engine, path, ...)``: the checkpoint at ``path`` must be the served model's architecture (every
config field but the path and the stated dtype equal). It is loaded as the served weights were
(``ModelRunner.load_weights``: dtype, quantization, packing; both sets in memory meanwhile) and swapped in, the
old set's memory handed back to the kernel; the radix cache is flushed when no request holds KV. With requests in flight the engine must be paused first (in
place they go on with their KV, as in SGLang) or ``abort_all_requests`` given. A refusal or a failed load leaves
the served weights as they were.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from typing import Any

from impl.config.model_config import ModelConfig
from impl.engine.allocator import release_freed_memory
from impl.kernels import cpu_attn

Engine = Any  # impl.engine.engine.Engine (which imports this module)

PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang's PauseGenerationReqInput.mode
logger = logging.getLogger("impl.engine")


def _in_flight(engine: Engine) -> int:
    sched = engine.scheduler
    return len(sched.running) + len(sched.waiting) + (sched.chunked_req is not None)


def _abort_all(engine: Engine) -> None:
    engine.scheduler.abort_request(None)
    engine.scheduler.process_inbox()


def pause(engine: Engine, mode: str) -> int:
    """Pause generation; how many requests it aborted, retracted or (``in_place``) kept in flight."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be one of {list(PAUSE_MODES)}, got {mode!r:.40}")
    with engine._step_lock.control():
        engine.paused = mode
        engine.scheduler.process_inbox()
        n = _in_flight(engine)
        if mode == "abort":
            _abort_all(engine)
        elif mode == "retract":
            n = engine.scheduler.decode.retract_all("generation paused")
        return n


def architecture_differences(served: ModelConfig, other: ModelConfig) -> list[str]:
    """The config fields in which ``other`` is not ``served``'s architecture (the path and stated dtype aside)."""
    return [f.name for f in dataclasses.fields(served) if f.name not in ("model_path", "torch_dtype")
            and getattr(served, f.name) != getattr(other, f.name)]


def update_weights(engine: Engine, model_path: str, abort_all_requests: bool = False,
                   weight_version: str | None = None, flush_cache: bool = True) -> tuple[bool, str, int]:
    """(success, message, requests paused meanwhile)."""
    if engine.spec_worker is not None:
        return False, ("updating weights with speculative decoding on is not served (the draft model reads the "
                       "target's layers); restart the server with the new --model-path"), 0
    try:
        config = ModelConfig.from_server_args(engine.server_args, model_path)
    except (ValueError, OSError) as e:
        return False, f"cannot read the checkpoint at {model_path!r:.300}: {e}", 0
    diff = architecture_differences(engine.runner.model_config, config)
    if diff:
        return False, (f"the checkpoint at {model_path!r:.300} is not the served model's architecture "
                       f"({', '.join(diff[:6])} differ); its weights cannot replace the served ones"), 0
    with engine._step_lock.control():
        engine.scheduler.process_inbox()
        in_flight = _in_flight(engine)
        if abort_all_requests:
            _abort_all(engine)
            in_flight = 0
        elif in_flight and engine.paused is None:
            return False, (f"{in_flight} request(s) in flight: POST /pause_generation first, or pass "
                           "abort_all_requests: true"), 0
        t = time.perf_counter()
        try:
            engine.runner.load_weights(model_path, config)
        except (ValueError, OSError, RuntimeError, KeyError) as e:
            logger.exception("update_weights_from_disk %s failed", model_path)
            return False, (f"loading the weights from {model_path!r:.300} failed ({type(e).__name__}: {e}); "
                           "the served weights are unchanged"), 0
        flushed = engine.scheduler.flush_cache() if flush_cache else True
        cpu_attn.drop_kept_packings()  # (packed copies of keys; the flushed cache's slots are reused)
        gc.collect()
        release_freed_memory()  # the old weights' pages, which glibc would keep (impl/engine/allocator.py)
    engine.weights_path = model_path
    if weight_version is not None:
        engine.weight_version = weight_version
    msg = f"Succeeded to update model weights from {model_path} in {time.perf_counter() - t:.1f} s."
    if not flushed:
        msg += " The radix cache was not flushed: requests in flight hold KV computed with the old weights."
    logger.info("%s", msg)
    return True, msg, in_flight if engine.paused is not None else 0
