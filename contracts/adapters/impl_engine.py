"""The ``engine`` capability of the ``impl`` subject: in-process generation through ``impl.Engine``.

``generate(argv, requests, batched)`` parses ``argv`` like the CLI, builds (and
caches, per distinct argv) an Engine, then runs the requests: all at once
(``batched``) or one after another. Every call starts from the same state: the
prefix cache is flushed and the work counters are zeroed, so ``GenResult.work``
sums exactly this call's forwards. KV accounting after the run is reported (not
asserted) so contracts decide what a leak is. ``GenResult.log`` holds the engine's startup
log followed by whatever the engine logged during the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import uuid
from typing import Any, Iterator, Sequence

from contracts.base import without_options
from contracts.logcapture import capture_logs
from contracts.subject import GenOutput, GenRequest, GenResult, TimedOutput

_ENGINES: dict[tuple[str, ...], tuple[Any, list[tuple[str, str]]]] = {}  # least recently used first
# Engines kept for reuse: beyond this the least recently used one is shut down (a whole spec run asks for a few
# hundred argv combinations; kept all, they held 16 GB in one pytest process).
MAX_CACHED_ENGINES = 16
# On a CUDA device an engine given neither --max-total-tokens nor --mem-fraction-static sizes its pool from 0.85
# of the GPU (SGLang's default, right for the one engine of a server): the second engine a contract keeps beside
# the first would find no memory. Engines built here get this fraction instead (4 GB of an 80 GB card, shrinking
# with what the engines before it hold; a tiny checkpoint needs a few MB).
CUDA_HARNESS_MEM_FRACTION = 0.05


@contextlib.contextmanager
def isolated_engines() -> Iterator[None]:
    """Engines built inside are private to the block and shut down after it, so a mutant's
    damage (a leaked slot, a corrupted cache) never reaches the engines other checks reuse."""
    global _ENGINES, _CONTINUATIONS
    saved, _ENGINES = _ENGINES, {}
    saved_cont, _CONTINUATIONS = _CONTINUATIONS, {}
    try:
        yield
    finally:
        _CONTINUATIONS = saved_cont
        for engine, _ in _ENGINES.values():
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001 - a broken (mutant) engine may fail its own checks here
                pass
        _ENGINES = saved
        if _on_cuda("auto"):  # the block's pools go back to the driver, for the engines after it
            gc.collect()
            import torch

            torch.cuda.empty_cache()


def _on_cuda(device: str) -> bool:
    import torch

    return device in ("auto", "cuda") and torch.cuda.is_available()


def engine_for(argv: Sequence[str]) -> tuple[Any, list[tuple[str, str]]]:
    """(Engine, startup log) for ``argv``, built once per distinct argv.

    ``--speculative-draft-model-path oracle:<assistant>`` (``tiny_model("assistant_oracle")``): the engine
    loads ``<assistant>`` and then drafts with an oracle that proposes the target's own greedy tokens,
    taken from a non-speculative engine on the same argv."""
    key = tuple(argv)
    if key in _ENGINES:
        _ENGINES[key] = _ENGINES.pop(key)  # now the most recently used
    else:
        from impl import Engine
        from impl.args.server_args import ServerArgs
        from impl.testing.oracle_draft import ORACLE_PREFIX, OracleDrafter

        args = ServerArgs.parse(argv)
        draft = args.speculative_draft_model_path or ""
        oracle = draft.startswith(ORACLE_PREFIX)
        if oracle:
            args.speculative_draft_model_path = draft[len(ORACLE_PREFIX):]
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
        if _on_cuda(args.device) and given["max_total_tokens"] is None and given["mem_fraction_static"] is None:
            given["mem_fraction_static"] = CUDA_HARNESS_MEM_FRACTION
        if given["model_path"] is None:  # as the launcher does (impl.server.runtime.build_engine), without its log line
            from impl.checkpoint_factory.checkpoints import default_model_path

            given["model_path"] = default_model_path()
        with capture_logs("impl") as log:
            engine = Engine(**given)
        if oracle:
            engine.spec_worker.drafter = OracleDrafter(
                _greedy_continuation(without_options(argv, "--speculative-")), engine.runner.model.compute_logits
            )
        _ENGINES[key] = (engine, list(log))
        while len(_ENGINES) > MAX_CACHED_ENGINES:
            old_key = next(iter(_ENGINES))
            old_engine, _ = _ENGINES.pop(old_key)
            old_engine.shutdown()
    return _ENGINES[key]


_CONTINUATIONS: dict[tuple[tuple[str, ...], tuple[int, ...], int], list[int]] = {}


def _greedy_continuation(argv: list[str]):
    """The oracle's source: greedy continuations from the non-speculative engine, remembered across engines."""

    def run(token_lists: list[list[int]], n: int) -> list[list[int]]:
        key = tuple(argv)
        todo = [t for t in token_lists if (key, tuple(t), n) not in _CONTINUATIONS]
        if todo:
            engine, _ = engine_for(argv)
            sp = {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}
            for t, o in zip(todo, engine.generate(input_ids=todo, sampling_params=[sp] * len(todo))):
                _CONTINUATIONS[(key, tuple(t), n)] = o["output_ids"]
        return [_CONTINUATIONS[(key, tuple(t), n)] for t in token_lists]

    return run


def _sampling_params(r: GenRequest) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "ignore_eos": r.ignore_eos}
    if r.top_k != -1:
        sp["top_k"] = r.top_k
    if r.seed is not None:
        sp["seed"] = r.seed
    return sp


def _to_output(o: dict[str, Any]) -> GenOutput:
    m = o["meta_info"]
    return GenOutput(
        output_ids=list(o["output_ids"]),
        output_logprobs=[lp for lp, _, _ in m.get("output_token_logprobs", [])],
        input_logprobs=[lp for lp, _, _ in m.get("input_token_logprobs", [])],
        finish_reason=m["finish_reason"],
        cached_tokens=m["cached_tokens"],
        spec_verify_ct=m.get("spec_verify_ct"),
        spec_accept_length=m.get("spec_accept_length"),
    )


def generate(argv: Sequence[str], requests: Sequence[GenRequest], batched: bool = True) -> GenResult:
    engine, startup = engine_for(argv)
    if not engine.flush_cache():
        raise RuntimeError("the engine still has requests in flight; cannot start a clean generation run")
    engine.reset_work_counters()

    def call(rs: Sequence[GenRequest]) -> list[dict[str, Any]]:
        return engine.generate(
            input_ids=[list(r.input_ids) for r in rs],
            sampling_params=[_sampling_params(r) for r in rs],
            return_logprob=[r.return_logprob for r in rs],
            logprob_start_len=[r.logprob_start_len for r in rs],
            top_logprobs_num=[r.top_logprobs_num for r in rs],
        )

    with capture_logs("impl") as log:
        outs = call(requests) if batched else [o for r in requests for o in call([r])]
    load = engine.load()
    return GenResult(
        outputs=[_to_output(o) for o in outs],
        work=engine.work_counters(),
        log=startup + list(log),
        kv_capacity=load.kv_tokens_total,
        kv_available_after=load.kv_tokens_available,
    )


def timed_generate(argv: Sequence[str], requests: Sequence[GenRequest]) -> list[TimedOutput]:
    """Stream ``requests`` (submitted together) through the cached engine for ``argv``, timing each on
    the process's CPU clock: the engine steps in this thread (no background loop) with few intra-op
    threads, so CPU time is the work done, free of the waits other jobs on a shared machine cause."""
    engine, _ = engine_for(argv)
    if not engine.flush_cache():
        raise RuntimeError("the engine still has requests in flight; cannot start a timed run")
    ids = [list(r.input_ids) for r in requests]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    rids = [f"timed-{uuid.uuid4().hex}" for _ in requests]
    # As timeit does: collect first, then no cyclic GC while timing. In a long test process (hundreds of
    # cached objects and engines) one full collection costs a sizeable share of a short run, and where it
    # falls decides which side of a pair pays for it.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.process_time()
        stream = engine.generate(input_ids=ids, sampling_params=[_sampling_params(r) for r in requests], stream=True,
                                 rid=rids)
        for out in stream:
            now = time.process_time() - t0
            rid = out["meta_info"]["id"]
            first.setdefault(rid, now)
            last[rid] = now
            count[rid] = len(out["output_ids"])
    finally:
        if was_enabled:
            gc.enable()
    return [TimedOutput(first[r], last[r], count[r], "process_cpu") for r in rids]
