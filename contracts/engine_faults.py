"""Engine fault isolation (issue 14, item 1): no request can hurt another, and none goes unanswered.

Faults are injected by request id (``contracts/fault_injection.py``: prompt-logprob
assembly, sampling, stop checking, output building, a forward pass, a KV integrity
check); the contract checks what a client of the engine sees: one final output per
submitted request, the failed ones with an error finish reason, the others with
exactly the tokens of a fault-free run, KV free afterwards, and an engine that stays
healthy, except after an integrity failure, where it reports itself unhealthy and
refuses new work instead of looping.
"""

from __future__ import annotations

from contracts.base import contract, require
from contracts.models import random_prompts
from contracts.subject import GenRequest

SOURCE = "issue 14 (server hardening), item 1"
PER_REQUEST_STAGES = ("logprobs", "sampler", "stop", "detok")


def _reqs(path: str) -> list[GenRequest]:
    ps = random_prompts(path, [9, 14, 6, 11, 8, 12, 7], seed=14)
    return [GenRequest(p, max_new_tokens=5, return_logprob=True, logprob_start_len=0, top_logprobs_num=2) for p in ps]


def _final_of(run, i: int, rid: str):
    finals = run.finals[i]
    require(len(finals) == 1, f"request {rid} got {len(finals)} final outputs, expected exactly one")
    return finals[0]


def _failed(final, rid: str, status: int) -> None:
    fr = final["meta_info"]["finish_reason"]
    require(fr.get("type") == "abort" and fr.get("status_code") == status and fr.get("message"),
            f"request {rid} must fail with an abort finish reason carrying status {status} and a message, got {fr}")


@contract("ENGINE-FAULT-ONE-FINAL", SOURCE, rules=("R1",), needs=("faults",))
def one_final_output(subject) -> None:
    """Every submitted request gets exactly one final output. A failure while handling one request (prompt-logprob
    assembly, sampling, stop checking, output building) fails only that request (abort, status 500, a message);
    the others finish with the tokens of a fault-free run; a failed forward fails only its batch; KV is free
    afterwards and the engine stays healthy. A failed KV integrity check makes the engine unhealthy: it says why
    and answers every later request with status 503 instead of looping."""
    path = subject.tiny_model("e2b")
    argv = ["--model-path", path, "--attention-backend", "torch_native"]
    reqs = _reqs(path)
    plain = [(r, f"ok-{i}") for i, r in enumerate(reqs)]
    # faults at even positions, healthy requests in between (all batched together)
    mixed, faulty = [], {}
    for i, r in enumerate(reqs):
        if i % 2 == 0 and i // 2 < len(PER_REQUEST_STAGES):
            rid = f"fault-{PER_REQUEST_STAGES[i // 2]}-{i}"
            faulty[i] = rid
        else:
            rid = f"healthy-{i}"
        mixed.append((r, rid))
    forward = [(reqs[0], "fault-forward-0"), (reqs[1], "same-batch-1")]
    after = [(reqs[1], "after-forward-1")]
    integrity = [(reqs[2], "fault-integrity-2")]
    refused = [(reqs[3], "after-unhealthy-3")]
    ref, run, fwd, aft, integ, late = subject.generate_with_faults(argv, [plain, mixed, forward, after, integrity,
                                                                          refused])
    want = [_final_of(ref, i, rid)["output_ids"] for i, (_, rid) in enumerate(plain)]
    require(all(len(w) == 5 for w in want), f"the fault-free run must give 5 tokens per request: {want}")
    for i, (_, rid) in enumerate(mixed):
        final = _final_of(run, i, rid)
        if i in faulty:
            _failed(final, rid, 500)
        else:
            require(final["output_ids"] == want[i], f"healthy request {rid} beside injected faults gave "
                    f"{final['output_ids']}, the fault-free run {want[i]}")
    for r in (ref, run, fwd, aft):
        require(r.kv_available_after == r.kv_capacity, f"KV not free after a run: {r.kv_available_after} of "
                f"{r.kv_capacity} slots available")
        require(r.unhealthy is None, f"the engine must stay healthy after isolated faults: {r.unhealthy}")
    for i, (_, rid) in enumerate(forward):
        _failed(_final_of(fwd, i, rid), rid, 500)
    got = _final_of(aft, 0, "after-forward-1")["output_ids"]
    require(got == want[1], f"a request after a failed batch gave {got}, the fault-free run {want[1]}")
    _final_of(integ, 0, "fault-integrity-2")
    require(integ.unhealthy is not None and "integrity" in integ.unhealthy,
            f"after a failed integrity check the engine must report itself unhealthy with the reason, got "
            f"{integ.unhealthy!r}")
    _failed(_final_of(late, 0, "after-unhealthy-3"), "after-unhealthy-3", 503)
