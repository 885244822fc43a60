"""The hybrid sliding-window KV pool (issue 25): ``--swa-full-tokens-ratio`` takes effect, and the pool is the default.

Sliding-window layers get ``ratio`` times the full-attention layers' token budget in the bytes one pool
would take; tokens that left every sliding layer's window give their sliding-window slot back when that
pool runs short; a cached prefix whose window was freed is matched only as far as it is still valid.
None of it may change an output, under eviction, preemption, chunked prefill, the radix cache and
speculative decoding; the engine's integrity check (every slot of both pools owned once, every live
window intact) must never fail, which a last request shows (an engine whose check failed refuses work).

Rule ids (issue 25's acceptance items, continuing V1-V3 of ``kv_fp8.py``): V4 the ratio sizes the two
budgets; V5 outputs and integrity unchanged by the hybrid pool; V6 it holds longer contexts in the same
bytes.
"""

from __future__ import annotations

import re

from contracts.base import contract, require, violation
from contracts.models import random_prompts
from contracts.subject import GenRequest

ISSUE = "issue 25 (hybrid sliding-window KV pool)"
MODEL = "e2b"  # 15 KV-owning layers: 12 sliding (window 16, head dim 16), 3 full (head dim 32)
ONE_POOL = "--disable-hybrid-swa-memory"
# The tight budget changes scheduling (preempted requests are prefilled again, chunks and batches differ), so
# the same positions are summed in other orders over up to 24 steps: float32 noise, 1.5e-4 measured. With fp8
# KV such a difference turns into a whole fp8 step where a value sits at a rounding boundary: 3e-3 measured.
# A preempted request is prefilled again over its own output tokens (a prefill's summation order where
# decoding wrote them): 1.2e-3 measured on an AVX-512 build, 1.0e-2 on an AVX2-only Zen 3 (its 8-lane kernels
# sum in other orders, and the random tiny model amplifies the difference over the steps after the recompute).
LOGPROB_TOL = {"float": 1e-3, "fp8": 0.05, "preemption": 2.5e-2}
HYBRID_LINE = re.compile(
    r"KV pool: hybrid sliding-window pool \(--swa-full-tokens-ratio (?P<ratio>[\d.]+)\): (?P<full_layers>\d+) "
    r"full-attention layers (?P<full_b>\d+) bytes per token, (?P<full>\d+) tokens; (?P<swa_layers>\d+) "
    r"sliding-window layers (?P<swa_b>\d+) bytes per token, (?P<swa>\d+) tokens; (?P<kv>\d+) of (?P<layers>\d+) "
    r"layers hold KV; the memory of (?P<one>\d+) one-pool tokens")
ONE_LINE = re.compile(r"KV pool: (?P<b>\d+) bytes per token, (?P<kv>\d+) of (?P<layers>\d+) layers hold KV, (?P<one>\d+) tokens")


def _argv(subject, *flags: str, model: str = MODEL) -> list[str]:
    return ["--model-path", subject.tiny_model(model), *flags]


def _pool_line(result) -> str:
    lines = [m for _, m in result.log if "KV pool:" in m]
    require(lines, "the startup log has no 'KV pool:' line")
    return lines[0]


def _run(subject, argv, reqs, what: str, batched: bool = True):
    try:
        return subject.generate(argv, reqs, batched=batched)
    except Exception as e:  # noqa: BLE001 - an engine that failed (or refuses work) breaks the contract
        raise violation(f"{what}: the engine failed: {type(e).__name__}: {e}") from None


def _healthy(subject, argv, what: str) -> None:
    """A last request: an engine whose integrity check failed (a leaked slot, a freed window) refuses it."""
    _run(subject, argv, [GenRequest([5, 6, 7], max_new_tokens=1)], f"{what}: a request after the run")


def _same_outputs(what: str, ref, got, logprobs: bool = True, tol: float = LOGPROB_TOL["float"]) -> None:
    require(len(ref.outputs) == len(got.outputs), f"{what}: {len(got.outputs)} outputs, expected {len(ref.outputs)}")
    for i, (a, b) in enumerate(zip(ref.outputs, got.outputs)):
        if a.output_ids != b.output_ids:
            step = next((k for k, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), None)
            raise violation(f"{what}: prompt {i}: greedy tokens differ at step {step}: one pool {a.output_ids}, "
                            f"hybrid pool {b.output_ids}")
        if logprobs:
            for step, (x, y) in enumerate(zip(a.output_logprobs, b.output_logprobs)):
                require(abs(x - y) <= tol, f"{what}: prompt {i} step {step}: logprob {y:.6f} (hybrid) vs "
                        f"{x:.6f} (one pool), more than {tol} apart")


@contract(
    "KV-SWA-POOL-BUDGETS", f"{ISSUE}: separate token budgets sized by --swa-full-tokens-ratio; seeds/004 K18 (the ratio's range)", rules=("V4", "K18"), needs=("engine",),
)
def swa_pool_budgets(subject) -> None:
    """By default (as in SGLang) an E2B-shaped model gets the hybrid pool: --max-total-tokens names the
    full-attention budget and sliding-window layers get --swa-full-tokens-ratio (default 0.8; 0.25 given) times
    it, as in SGLang; the startup log states bytes per token and tokens of each pool and the one-pool tokens of
    the same bytes; KV-shared layers own nothing; --disable-hybrid-swa-memory keeps one pool of that budget."""
    one = 4000
    req = [GenRequest([5, 6, 7], max_new_tokens=1)]
    base = _pool_line(_run(subject, _argv(subject, "--max-total-tokens", str(one), ONE_POOL), req, "one pool"))
    m1 = ONE_LINE.search(base)
    if m1 is None or int(m1["one"]) != one:
        raise violation(f"{ONE_POOL}: expected one pool of {one} tokens, the log says {base!r}")
    for ratio, flags in ((0.8, ()), (0.25, ("--swa-full-tokens-ratio", "0.25"))):
        line = _pool_line(_run(subject, _argv(subject, "--max-total-tokens", str(one), *flags), req, f"ratio {ratio}"))
        m = HYBRID_LINE.search(line)
        if m is None:
            raise violation(f"ratio {ratio}: expected the hybrid sliding-window pool by default, the log says {line!r}")
        full, swa, fb, sb = int(m["full"]), int(m["swa"]), int(m["full_b"]), int(m["swa_b"])
        require(float(m["ratio"]) == ratio and full == one and swa == int(full * ratio),
                f"ratio {ratio}: {full} full-attention and {swa} sliding-window tokens for --max-total-tokens {one} "
                f"(expected {one} and {int(one * ratio)})")
        require(fb + sb == int(m1["b"]) and int(m["kv"]) == int(m1["kv"]) == 15 and int(m["full_layers"]) == 3,
                f"ratio {ratio}: the pools' layers and bytes per token ({fb} + {sb}) must be the one pool's "
                f"({m1['b']}, 15 KV-owning layers: 12 sliding, 3 full; the 20 KV-shared layers own nothing)")
        require(int(m["one"]) == (full * fb + swa * sb) // (fb + sb),
                f"ratio {ratio}: the log's one-pool equivalent ({m['one']} tokens) is not the bytes of the two pools")


@contract(
    "KV-SWA-OUTPUTS-AND-INTEGRITY", rules=("V5",), needs=("engine",),
    source=f"{ISSUE}: eviction, preemption, chunked prefill and the radix cache included; the integrity check covering both "
    "pools",
)
def swa_outputs_and_integrity(subject) -> None:
    """Under a tight budget (windows freed, prefixes evicted, requests preempted) the hybrid pool gives the one
    pool's greedy tokens and logprobs: 24 prompts batched (also with fp8 KV and with fast prefill), chunked
    prefill, preemption (a budget where decoding runs short), and repeated prompts over the radix cache (prefixes
    whose window was freed matched only as far as still valid); the engine stays healthy (its integrity check of
    both pools and every live window never fails)."""
    from contracts.yoco_engine import LENGTHS

    ps = random_prompts(subject.tiny_model(MODEL), LENGTHS, seed=7)
    reqs = [GenRequest(p, max_new_tokens=24, return_logprob=True) for p in ps]
    tight = ("--max-total-tokens", "500", "--swa-full-tokens-ratio", "0.3")  # 500 full, 150 sliding-window slots
    # 120 full, 36 sliding-window slots in chunks of 16: decoding runs short and requests are preempted
    preempting = ("--max-total-tokens", "120", "--swa-full-tokens-ratio", "0.3")
    runs = [
        ("batched", tight, (), MODEL),
        # e2b_calm (e2b's config, a well-conditioned init): scheduling under the tight budget sums in other
        # orders, which fp8 can turn into a whole fp8 step, and the random e2b into another greedy token
        ("batched, fp8 KV", tight, ("--kv-cache-dtype", "fp8_e4m3"), "e2b_calm"),
        ("batched, fast prefill", tight, ("--attention-backend", "triton", "--decode-attention-backend", "torch_native",
                                          "--kv-sharing-fast-prefill"), MODEL),
        ("chunked prefill (16)", tight, ("--chunked-prefill-size", "16"), MODEL),
        ("preemption (chunks of 16)", preempting, ("--chunked-prefill-size", "16"), MODEL),
    ]
    for what, budget, common, model in runs:
        ref = _run(subject, _argv(subject, "--disable-radix-cache", ONE_POOL, *common, model=model), reqs,
                   f"{what}, one pool")
        hyb = _argv(subject, "--disable-radix-cache", *budget, *common, model=model)
        tol = LOGPROB_TOL[next((k for k in ("fp8", "preemption") if k in what), "float")]
        _same_outputs(what, ref, _run(subject, hyb, reqs, f"{what}, hybrid pool"), tol=tol)
        _healthy(subject, hyb, what)
    # The radix cache: each prompt twice in a row, one by one; the long decodes free windows the second copy needs.
    twice = [r for r in reqs[8:20] for _ in (0, 1)]
    ref = _run(subject, _argv(subject, ONE_POOL), twice, "radix cache, one pool", batched=False)
    hyb = _argv(subject, "--max-total-tokens", "300", "--swa-full-tokens-ratio", "0.3")
    got = _run(subject, hyb, twice, "radix cache, hybrid pool", batched=False)
    _same_outputs("radix cache (repeated prompts)", ref, got)
    require(any(o.cached_tokens > 0 for o in got.outputs[1::2]), "repeated prompts must hit the radix cache")
    _healthy(subject, hyb, "radix cache")


@contract(
    "KV-SWA-SPECULATIVE", f"{ISSUE}: speculative decoding (rejected drafts freed from both pools)", rules=("V5", "S1"), needs=("engine",),
)
def swa_speculative(subject) -> None:
    """With speculative decoding (FROZEN_KV_MTP, a random draft whose drafts are rejected, and an oracle whose drafts
    are accepted) on the hybrid pool under a tight budget, greedy tokens equal plain decoding's with one pool and
    the engine stays healthy: rejected draft rows are freed from both pools."""
    from contracts.spec_decoding import LENGTHS, _spec

    ps = random_prompts(subject.tiny_model(MODEL), LENGTHS, seed=11)
    reqs = [GenRequest(p, max_new_tokens=20) for p in ps]
    ref = _run(subject, _argv(subject, "--disable-radix-cache", ONE_POOL), reqs, "one pool, no speculation")
    for draft in ("assistant", "assistant_oracle"):
        argv = _argv(subject, "--max-total-tokens", "500", "--swa-full-tokens-ratio", "0.3", *_spec(subject, draft))
        _same_outputs(f"draft {draft}", ref, _run(subject, argv, reqs, f"hybrid pool, draft {draft}"), logprobs=False)
        _healthy(subject, argv, f"draft {draft}")


@contract("KV-SWA-LONGER-CONTEXT", f"{ISSUE}: long context in little memory", rules=("V6",), needs=("engine",))
def swa_longer_context(subject) -> None:
    """In fewer KV bytes than a 250-token one pool (which refuses it) the hybrid pool (420 full-attention tokens,
    ratio 0.25) serves a 400-token context, with the greedy tokens one pool gives it with memory to spare."""
    p = random_prompts(subject.tiny_model(MODEL), [392], seed=3)[0]
    reqs = [GenRequest(p, max_new_tokens=8, return_logprob=True)]
    ref = _run(subject, _argv(subject, ONE_POOL), reqs, "one pool with memory to spare")
    got = _run(subject, _argv(subject, "--max-total-tokens", "420", "--swa-full-tokens-ratio", "0.25"), reqs,
               "hybrid pool")
    _same_outputs("a 400-token context", ref, got)
    m = HYBRID_LINE.search(_pool_line(got))
    require(m is not None, "expected the hybrid sliding-window pool")
    assert m is not None
    hybrid_bytes = int(m["full"]) * int(m["full_b"]) + int(m["swa"]) * int(m["swa_b"])
    one_bytes = 250 * (int(m["full_b"]) + int(m["swa_b"]))
    require(hybrid_bytes < one_bytes, f"the hybrid pool takes {hybrid_bytes} KV bytes, not fewer than the 250-token "
            f"one pool's {one_bytes}")
    try:
        subject.generate(_argv(subject, "--max-total-tokens", "250", ONE_POOL), reqs)
    except Exception:  # noqa: BLE001 - refused (over the context the budget allows), as it should be
        return
    raise violation("one pool of 250 tokens served a 400-token context: the budget is not what the flags say")
