"""Injected faults for the ``impl`` subject: a request whose rid names a stage fails there.

The implementation carries no test hooks; this module patches it from the
outside (in process for the engine, or in a server process through
``python -m contracts.fault_injection [launch_server args]``). A request whose
rid contains ``fault-<stage>`` raises at that stage:

* ``logprobs``: assembling its prompt logprobs (``OutputProcessor._prompt_logprobs``);
* ``sampler``: sampling its row (``impl.engine.output_processor.sample``; the whole batched call raises);
* ``stop``: stop checking after a token (``OutputProcessor._check_finished``);
* ``detok``: building its outputs on the detokenizer stage (``impl.engine.detokenizer_stage.build_output``);
* ``forward``: the forward pass of the first batch that holds it (the whole batch fails);
* ``verify`` / ``draft`` (speculative decoding): the first verify forward / draft round that holds it
  (every request of that round fails);
* ``integrity``: the next KV integrity check after it finishes (the engine must turn unhealthy).

No contracts live here; ``contracts/engine_faults.py`` and ``tests/server/test_faults.py`` use it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator

STAGES = ("logprobs", "sampler", "stop", "detok", "forward", "verify", "draft", "integrity")
MARK = "fault-"


class InjectedFault(RuntimeError):
    """The deliberate failure (its message names the stage and the request)."""


def stage_of(rid: str | None) -> str | None:
    if not rid or MARK not in rid:
        return None
    tail = rid.split(MARK, 1)[1]
    return next((s for s in STAGES if tail.startswith(s)), None)


def _patches() -> list[tuple[Any, str, Any]]:
    import impl.engine.detokenizer_stage as stage_mod
    import impl.engine.output_processor as output_mod
    from impl.engine.scheduler import Scheduler
    from impl.engine.kv_lifecycle import KVLifecycle
    from impl.engine.model_runner import ModelRunner
    from impl.engine.speculative.draft import FrozenKVDrafter

    marked: dict[int, Any] = {}  # id(req.origin_input_ids) -> req, for marked requests (keeps the list alive)
    forward_failed: set[str] = set()  # rids whose forward / verify / draft fault has fired (once each)
    integrity_armed: list[bool] = [False]

    def boom(stage: str, rid: str) -> InjectedFault:
        return InjectedFault(f"injected {stage} fault for request {rid}")

    orig_add = Scheduler.add_request

    def add_request(self, req):
        if stage_of(req.rid) is not None:
            marked[id(req.origin_input_ids)] = req
        return orig_add(self, req)

    OutputProcessor = output_mod.OutputProcessor
    orig_logprobs = OutputProcessor._prompt_logprobs

    def prompt_logprobs(self, it, rows):
        if stage_of(it.req.rid) == "logprobs":
            raise boom("logprobs", it.req.rid)
        return orig_logprobs(self, it, rows)

    orig_sample = output_mod.sample

    def sample(logits, rows, eos_ids):
        for row in rows:
            req = marked.get(id(row.prompt_ids))
            if req is not None and stage_of(req.rid) == "sampler":
                raise boom("sampler", req.rid)
        return orig_sample(logits, rows, eos_ids)

    orig_check = OutputProcessor._check_finished

    def check_finished(self, req, tok):
        if stage_of(req.rid) == "stop":
            raise boom("stop", req.rid)
        return orig_check(self, req, tok)

    orig_build = stage_mod.build_output

    def build_output(em):
        if stage_of(em.handle.req.rid) == "detok":
            raise boom("detok", em.handle.req.rid)
        return orig_build(em)

    orig_forward = ModelRunner.forward

    def fire_once(stage: str, reqs) -> None:
        for req in reqs:
            if stage_of(req.rid) == stage and not req.is_finished and req.rid not in forward_failed:
                forward_failed.add(req.rid)
                raise boom(stage, req.rid)

    def forward(self, fb):
        rows = set(fb.req_pool_indices.tolist())
        held = [r for r in list(marked.values()) if r.req_pool_idx in rows]
        fire_once("forward", held)
        if fb.spec_verify:
            fire_once("verify", held)
        return orig_forward(self, fb)

    orig_draft = FrozenKVDrafter.draft

    def draft(self, reqs, steps):
        fire_once("draft", reqs)
        return orig_draft(self, reqs, steps)

    orig_integrity = KVLifecycle.check_integrity

    def check_integrity(self, live, idle=False):
        if integrity_armed[0]:
            raise AssertionError("injected integrity fault: a slot is owned twice")
        if any(stage_of(r.rid) == "integrity" and r.is_finished for r in marked.values()):
            integrity_armed[0] = True
            raise AssertionError("injected integrity fault: a slot is owned twice")
        return orig_integrity(self, live, idle)

    return [
        (Scheduler, "add_request", add_request),
        (OutputProcessor, "_prompt_logprobs", prompt_logprobs),
        (output_mod, "sample", sample),
        (OutputProcessor, "_check_finished", check_finished),
        (stage_mod, "build_output", build_output),
        (ModelRunner, "forward", forward),
        (FrozenKVDrafter, "draft", draft),
        (KVLifecycle, "check_integrity", check_integrity),
    ]


def install() -> None:
    """Patch for the rest of the process (a server launched through ``main``)."""
    for obj, name, value in _patches():
        setattr(obj, name, value)


@contextlib.contextmanager
def injected() -> Iterator[None]:
    """Patch for the duration of the block (in-process engines)."""
    patches = _patches()
    saved = [(obj, name, obj.__dict__[name]) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def main(argv: list[str]) -> int:
    install()
    from impl.launch_server import main as launch

    return launch(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


# ---------------------------------------------------------------- the ``faults`` capability of the impl subject


@dataclass
class FaultRun:
    """One run of ``generate_with_faults``: per request its final outputs (normally exactly one)."""

    finals: list[list[dict[str, Any]]]  # per request: every output that carried a finish_reason
    kv_capacity: int
    kv_available_after: int
    unhealthy: str | None  # the engine's health after the run (None: healthy)


def run_with_faults(argv, runs) -> list[FaultRun]:
    """``runs``: lists of (GenRequest, rid); each run is submitted at once and driven to the end, on one
    private engine, runs in order, faults injected by rid (``STAGES``). A submit the engine refuses
    (unhealthy) counts as that request's final answer, with status 503."""
    from contracts.adapters.impl_engine import _sampling_params, engine_for, isolated_engines

    results = []
    with isolated_engines():
        engine, _ = engine_for(argv)
        with injected():
            for run in runs:
                results.append(_one_run(engine, run, _sampling_params))
    return results


def _one_run(engine, run, sampling_params) -> FaultRun:
    from impl.engine.engine import EngineUnhealthyError
    from impl.engine.output import SGLangDicts

    handles: list[Any] = []
    refused: dict[int, dict[str, Any]] = {}
    for i, (r, rid) in enumerate(run):
        reqs = engine.expand_requests([list(r.input_ids)], sampling_params(r), r.return_logprob, r.logprob_start_len,
                                      r.top_logprobs_num, rid)
        try:
            handles.append(engine.submit(reqs, stream=True)[0])
        except EngineUnhealthyError as e:
            handles.append(None)
            refused[i] = {"text": "", "output_ids": [], "meta_info": {
                "id": rid, "finish_reason": {"type": "abort", "message": str(e), "status_code": 503}}}
    for _ in range(100_000):
        if all(h is None or h.done.is_set() for h in handles):
            break
        if not engine.step() and not engine.scheduler.has_work:
            break
    engine.step()  # one idle step: the idle integrity check runs
    engine._detokenizer.drain()  # every output built so far is delivered
    engine.step()  # aborts the detokenizer stage asked for
    engine._detokenizer.drain()
    finals = []
    for i, h in enumerate(handles):
        if h is None:
            finals.append([refused[i]])
            continue
        outs, dicts = [], SGLangDicts()
        while not h.queue.empty():
            outs.append(dicts.add(h.queue.get_nowait()))
        finals.append([o for o in outs if o["meta_info"]["finish_reason"] is not None])
    load = engine.load()
    return FaultRun(finals, load.kv_tokens_total, load.kv_tokens_available, engine.health())
