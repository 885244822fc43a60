"""The hybrid pool's request cap (issue 25; SGLang 0.5.23's ``SWARequestCapPoolConfigurator``).

With ``--max-running-requests`` given, the radix cache off and chunked prefill on, SGLang sizes the
sliding-window pool from the requests it must hold, not from ``--swa-full-tokens-ratio``:
``max_running_requests x (window + eviction interval x draft tokens + page + decode allocation) +
chunked_prefill_size + page``, the full-attention pool getting the rest (here ``--max-total-tokens``, which
names the full-attention pool). Requests free the tokens that left their window as they go (each prefill
chunk; decoding, every eviction interval: SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``, 128), so the pool is
never short: a request is admitted only when its worst case fits beside the admitted ones', and no request is
preempted for it.

Rule ids continue ``kv_swa_pool.py``'s: V7 the request cap sizes the sliding-window pool when its
preconditions hold (the ratio otherwise), the startup log saying which and why; V8 under the cap the
sliding-window pool is never over-committed (no preemption), outputs and integrity unchanged.
"""

from __future__ import annotations

import re

from contracts.base import contract, require, violation
from contracts.kv_swa_pool import LOGPROB_TOL, ONE_POOL, _argv, _healthy, _run, _same_outputs
from contracts.models import random_prompts
from contracts.subject import GenRequest

ISSUE = "issue 25 (hybrid sliding-window KV pool: SGLang's request-cap sizing)"
MODEL = "e2b"  # sliding window 16; 3 full-attention and 12 sliding-window layers own KV
WINDOW, INTERVAL = 16, 128  # the model's window; SGLang's default eviction interval
CAP = ("--max-running-requests", "3", "--disable-radix-cache", "--chunked-prefill-size", "16")
POOL_LINE = re.compile(r"KV pool: hybrid sliding-window pool \((?P<sizing>[^)]*)\): \d+ full-attention layers \d+ "
                       r"bytes per token, (?P<full>\d+) tokens; \d+ sliding-window layers \d+ bytes per token, "
                       r"(?P<swa>\d+) tokens")
SIZING_LINE = re.compile(r"KV pool sizing: (?P<mode>request cap|--swa-full-tokens-ratio)\b.*?because (?P<reason>.*)")
RETRACTED = "retracted request"


def _cap_tokens(running: int, chunk: int, draft_tokens: int = 1, decode_alloc: int = 1) -> int:
    """SGLang's compute_swa_request_cap with page 1 and one chunk in flight (no overlap scheduler)."""
    return running * (WINDOW + INTERVAL * draft_tokens + 1 + decode_alloc) + chunk + 1


def _sizing(subject, argv, what: str) -> tuple[str, str, int, int]:
    """(sizing mode, reason, full-attention tokens, sliding-window tokens) from the startup log of ``argv``."""
    res = _run(subject, argv, [GenRequest([5, 6, 7], max_new_tokens=1)], what)
    pool = next((m for _, m in res.log if "KV pool:" in m), "")
    m = POOL_LINE.search(pool)
    s = next((SIZING_LINE.search(m2) for _, m2 in res.log if "KV pool sizing:" in m2), None)
    if m is None or s is None:
        raise violation(f"{what}: expected a hybrid 'KV pool:' line and a 'KV pool sizing:' line, the log says "
                        f"{[x for _, x in res.log if 'KV pool' in x]}")
    mode = "request_cap" if s["mode"] == "request cap" else "ratio"
    require((mode == "request_cap") == (m["sizing"] == "request cap"),
            f"{what}: the pool line says {m['sizing']!r}, the sizing line {s['mode']!r}")
    return mode, s["reason"], int(m["full"]), int(m["swa"])


@contract(
    "KV-SWA-REQUEST-CAP-SIZING", f"{ISSUE}: the cap's sizing and its preconditions", rules=("V7",), needs=("engine",),
)
def swa_request_cap_sizing(subject) -> None:
    """With --max-running-requests, --disable-radix-cache and chunked prefill (SGLang's
    SWARequestCapPoolConfigurator) the sliding-window pool holds max_running_requests x (window + 128 x draft
    tokens + 1 + decode allocation) + chunk + 1 tokens (3 x 146 + 17 = 455 on the tiny e2b; 3 x 533 + 17 with 3
    speculative steps) and --max-total-tokens the full-attention pool; the startup log says 'request cap' and why.
    Without one of the three (the radix cache on, --max-running-requests unset, --chunked-prefill-size -1) the
    ratio sizes it and the log names what is missing; a --max-total-tokens too small for one request's worst case
    is refused at startup."""
    from contracts.spec_decoding import _spec

    full = 2000
    budget = ("--max-total-tokens", str(full))
    mode, reason, f, s = _sizing(subject, _argv(subject, *CAP, *budget), "request cap")
    require(mode == "request_cap", f"{' '.join(CAP)}: expected the request cap, the log says the ratio ({reason})")
    require((f, s) == (full, _cap_tokens(3, 16)),
            f"request cap: {f} full-attention and {s} sliding-window tokens; expected {full} (--max-total-tokens) and "
            f"{_cap_tokens(3, 16)} = 3 x ({WINDOW} + {INTERVAL} + 1 + 1) + 16 + 1")
    spec = _spec(subject, "assistant", "--speculative-num-steps", "3")
    mode, reason, f, s = _sizing(subject, _argv(subject, *CAP, *budget, *spec), "request cap, speculative decoding")
    want = _cap_tokens(3, 16, draft_tokens=4, decode_alloc=4)
    require(mode == "request_cap" and s == want,
            f"request cap with 3 speculative steps (4 draft tokens): {s} sliding-window tokens ({mode}); expected "
            f"{want} = 3 x ({WINDOW} + {INTERVAL} x 4 + 1 + 4) + 16 + 1")
    for flags, missing in (((*CAP[:2], *CAP[3:]), "radix cache is on"),
                           (CAP[2:], "--max-running-requests is not given"),
                           ((*CAP[:3], "--chunked-prefill-size", "-1"), "chunked prefill is off")):
        mode, reason, f, s = _sizing(subject, _argv(subject, *flags, *budget), f"{' '.join(flags)}")
        require(mode == "ratio" and (f, s) == (full, int(full * 0.8)),
                f"{' '.join(flags)}: expected the ratio's pools ({full}, {int(full * 0.8)}), got {mode} ({f}, {s})")
        require(missing in reason, f"{' '.join(flags)}: the sizing line should say why not the cap ({missing!r}); it "
                f"says {reason!r}")
    small = _argv(subject, *CAP, "--max-total-tokens", "120")
    try:
        subject.generate(small, [GenRequest([5, 6, 7], max_new_tokens=1)])
    except Exception as e:  # noqa: BLE001 - refused at startup, as it should be
        require("worst case" in str(e), f"--max-total-tokens 120 under the request cap: refused, but not for the "
                f"cap's worst case: {e}")
        return
    raise violation("--max-total-tokens 120 under the request cap (one request's worst case: 146) was served: a "
                    "long request could never be admitted")


@contract(
    "KV-SWA-REQUEST-CAP-HOLDS", f"{ISSUE}: the cap relies on eviction; integrity under eviction, preemption, chunked prefill and speculation", rules=("V8", "V5"), needs=("engine",),
)
def swa_request_cap_holds(subject) -> None:
    """Under the request cap (3 running, chunks of 16, a full-attention pool to spare) prompts of 120-200 tokens (40
    new tokens each) free their out-of-window sliding-window KV chunk by chunk, and a short prompt decoding 170
    tokens every 128 tokens, so the pool the cap sized is never short: no request is preempted, and greedy tokens
    and logprobs equal one pool's; also with speculative decoding, and with a full-attention pool that preempts
    (the cap's pool then min(cap, --max-total-tokens), admissions within it). The engine stays healthy (both
    pools' integrity)."""
    from contracts.spec_decoding import _spec

    ps = random_prompts(subject.tiny_model(MODEL), [200, 120, 170, 150, 9], seed=5)
    # the last one decodes past its window + the eviction interval (16 + 128): its decode tokens are freed too
    reqs = [GenRequest(p, max_new_tokens=170 if len(p) < 16 else 40, return_logprob=True) for p in ps]
    ref = _run(subject, _argv(subject, ONE_POOL, "--disable-radix-cache", "--chunked-prefill-size", "16"), reqs,
               "one pool")
    roomy = ("--max-total-tokens", "2000")
    argv = _argv(subject, *CAP, *roomy)
    got = _run(subject, argv, reqs, "request cap")
    _same_outputs("request cap", ref, got)
    retracted = [m for _, m in got.log if RETRACTED in m]
    require(not retracted, f"request cap: {len(retracted)} preemption(s) with a full-attention pool to spare: the "
            f"sliding-window pool the cap sized ran short (a request held more than its cap): {retracted[:2]}")
    _healthy(subject, argv, "request cap")
    spec = _argv(subject, *CAP, *roomy, *_spec(subject, "assistant"))
    got = _run(subject, spec, [GenRequest(r.input_ids, max_new_tokens=r.max_new_tokens) for r in reqs],
               "request cap, speculative")
    _same_outputs("request cap, speculative decoding", ref, got, logprobs=False)
    retracted = [m for _, m in got.log if RETRACTED in m]
    require(not retracted, f"request cap, speculative decoding: {len(retracted)} preemption(s) with a full-attention "
            "pool to spare")
    _healthy(subject, spec, "request cap, speculative decoding")
    # full 320 tokens, sliding-window min(455, 320): two long requests' worst cases fit, their contexts do not
    tight = _argv(subject, *CAP, "--max-total-tokens", "320")
    got = _run(subject, tight, reqs, "request cap, preemption")
    require(any(RETRACTED in m for _, m in got.log), "request cap, --max-total-tokens 320: expected the full-attention "
            "pool to run short and preempt (the leg checks integrity under preemption)")
    _same_outputs("request cap, preemption", ref, got, tol=LOGPROB_TOL["preemption"])
    _healthy(subject, tight, "request cap, preemption")
