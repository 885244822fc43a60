"""Speculative decoding with the Gemma-4 assistant (FROZEN_KV_MTP, issue 15): S1-S4.

NEXTN with a Gemma-4 assistant draft is promoted to FROZEN_KV_MTP; the loop drafts
a chain of tokens over the target's K/V and verifies it in one target forward.
Speculation must change no output: greedy tokens equal plain decoding's, sampled
tokens follow the target's distribution, and no KV slot outlives its request.

Drafts (``subject.tiny_model``): "assistant" (random weights: every draft rejected),
"assistant_distilled" (distilled from the random-weight target, whose continuations it cannot predict:
drafts nearly always rejected; the trained benchmark pair e2b_markov / assistant_markov, acceptance ~3.9
of 4, is on demand, ``make bench-spec``),
"assistant_oracle" (proposes the target's own greedy tokens: every draft accepted).
"""

from __future__ import annotations

import math
from collections import Counter

from contracts.base import contract, require, violation
from contracts.kv_accounting import generate_freeing_kv
from contracts.models import first_difference, random_prompts, triton_prefill_argv
from contracts.subject import GenRequest

SOURCE = "issue 15 (speculative decoding with the Gemma-4 assistant)"
MODEL = "e2b"
FLAG = "--kv-sharing-fast-prefill"
STEPS = 3
# 24 prompts: shorter than, equal to and longer than the sliding window (16), several windows long.
LENGTHS = [1, 2, 3, 5, 7, 9, 12, 15, 16, 17, 19, 23, 28, 31, 32, 33, 37, 41, 47, 52, 58, 64, 71, 80]
NEW_TOKENS = 8  # prefill token + verifies of 4 + 3 (the second cut by max_new_tokens) with an all-accepted chain


def _spec(subject, draft: str, *flags: str) -> list[str]:
    return ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", subject.tiny_model(draft), *flags]


def _triton(subject, *flags: str) -> list[str]:
    return triton_prefill_argv(subject.tiny_model(MODEL), *flags)


def _torch_native(subject, *flags: str) -> list[str]:
    return ["--model-path", subject.tiny_model(MODEL), "--attention-backend", "torch_native", *flags]


def _same_tokens(what: str, ref, got) -> None:
    require(len(ref.outputs) == len(got.outputs), f"{what}: {len(got.outputs)} outputs, expected {len(ref.outputs)}")
    for i, (a, b) in enumerate(zip(ref.outputs, got.outputs)):
        if a.output_ids != b.output_ids:
            step = first_difference(a.output_ids, b.output_ids)
            step = min(len(a.output_ids), len(b.output_ids)) if step is None else step
            raise violation(
                f"{what}: prompt {i}: tokens differ at step {step}: without speculation {a.output_ids}, with {b.output_ids}"
            )


def _expected_verifies(new_tokens: int, steps: int) -> int:
    """Verifies of an all-accepted chain: the prefill commits 1 token, each verify 1 + steps (the last cut)."""
    return math.ceil((new_tokens - 1) / (steps + 1))


@contract(
    "SPEC-GREEDY-PARITY", f"{SOURCE}: the loop, acceptance (greedy)", rules=("S1",), needs=("engine",),
    rule=f"Greedy outputs with MTP (NEXTN -> FROZEN_KV_MTP, {STEPS}-token chains) equal those without, token for token, for "
    "24 prompts, batched and one by one, with a distilled, a random (every draft rejected) and an oracle draft (every "
    "draft accepted, so rounds are cut at max_new_tokens); the oracle's verify count proves every draft was accepted.",
)
def spec_greedy_parity(subject) -> None:
    ps = random_prompts(subject.tiny_model(MODEL), LENGTHS, 11)
    reqs = [GenRequest(p, max_new_tokens=NEW_TOKENS, return_logprob=True) for p in ps]
    base = ("--disable-radix-cache",)
    for batched in (True, False):
        how = "batched" if batched else "one by one"
        ref = subject.generate(_torch_native(subject, *base), reqs, batched=batched)
        for draft in ("assistant_distilled", "assistant", "assistant_oracle"):
            got = subject.generate(_torch_native(subject, *base, *_spec(subject, draft)), reqs, batched=batched)
            _same_tokens(f"{how}, draft {draft}", ref, got)
            for i, o in enumerate(got.outputs):
                require(o.spec_verify_ct is not None, f"{how}, draft {draft}: meta_info.spec_verify_ct is missing")
                if draft == "assistant_oracle":
                    want = _expected_verifies(NEW_TOKENS, STEPS)
                    require(
                        o.spec_verify_ct == want,
                        f"{how}, oracle draft, prompt {i}: {o.spec_verify_ct} verifies for {NEW_TOKENS} tokens; with every "
                        f"draft accepted it takes {want} (accept length {o.spec_accept_length})",
                    )
                if draft == "assistant":
                    require(
                        o.spec_accept_length is not None and o.spec_accept_length <= 1.0 + 1e-9,
                        f"{how}, random draft, prompt {i}: accept length {o.spec_accept_length} > 1 although a random "
                        "draft's tokens should all be rejected",
                    )


@contract(
    "SPEC-FAST-PREFILL", f"{SOURCE}: with fast prefill on", rules=("S2",), needs=("engine",),
    rule=f"MTP with {FLAG} gives the same greedy tokens as MTP without it and as no speculation; with the flag on, verify "
    "rows all run through the cross-decoder (every verify row feeds the LM head) while prefill batches keep the split.",
)
def spec_fast_prefill(subject) -> None:
    # Few, short requests: on a CPU-only machine the triton kernels run interpreted (slow). The oracle draft
    # (every draft accepted) keeps verify forwards few and makes every verify row count.
    ps = random_prompts(subject.tiny_model(MODEL), [4, 9, 18], 12)
    new_tokens = 6  # prefill token + one verify of 4 + one cut to 1
    reqs = [GenRequest(p, max_new_tokens=new_tokens) for p in ps]
    base = ("--disable-radix-cache",)
    ref = subject.generate(_triton(subject, *base), reqs)
    draft = "assistant_oracle"
    off = subject.generate(_triton(subject, *base, *_spec(subject, draft)), reqs)
    on = subject.generate(_triton(subject, *base, FLAG, *_spec(subject, draft)), reqs)
    _same_tokens(f"MTP without {FLAG} vs no speculation", ref, off)
    _same_tokens(f"MTP with {FLAG} vs no speculation", ref, on)
    w = on.work
    prefill_rows = sum(len(p) for p in ps)
    verify_rows = w["decode_tokens"]  # verify batches: bonus + drafts of every request
    want_rows = len(ps) * (new_tokens - 1)  # all accepted: every verify row is committed
    require(verify_rows == want_rows, f"{verify_rows} verify rows counted, expected {want_rows} (all drafts accepted)")
    require(
        w["cross_decoder_rows"] == len(ps) + verify_rows,
        f"{FLAG} on: the cross-decoder ran {w['cross_decoder_rows']} rows; expected one per prompt in the prefill "
        f"({len(ps)}) plus every verify row ({verify_rows})",
    )
    require(
        w["skipped_cross_decoder_rows"] == prefill_rows - len(ps),
        f"{FLAG} on: {w['skipped_cross_decoder_rows']} rows skipped the cross-decoder; expected the prefill rows that "
        f"feed no LM head ({prefill_rows - len(ps)}) and no verify row",
    )
    require(
        off.work["skipped_cross_decoder_rows"] == 0,
        f"without {FLAG} no row may skip the cross-decoder, {off.work['skipped_cross_decoder_rows']} did",
    )


# Sampling: top_k keeps a tiny vocabulary (4 tokens per step); a two-sample chi-square test at false-alarm
# rate ALPHA compares the tokens committed by the first verify with and without MTP (seeded requests: the
# verdict is deterministic). The oracle drafts the target's greedy tokens, which a sound sampler accepts
# only with the target's probability for them.
SAMPLES = 400
ALPHA = 1e-3
TOP_K = 4
TEMPERATURE = 1.5


def _chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma, series/fraction)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for the lower part
        term = s = 1.0 / a
        k = a
        for _ in range(500):
            k += 1
            term *= z / k
            s += term
        return max(0.0, 1.0 - s * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction for the upper part (Lentz)
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
    return min(1.0, math.exp(-z + a * math.log(z) - math.lgamma(a)) * h)


def two_sample_chi2(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """(p-value, dof) of 'a and b come from one distribution'; rare categories pooled into one."""
    cats = [k for k in set(a) | set(b) if a[k] + b[k] >= min_count]
    rare = [k for k in set(a) | set(b) if k not in cats]
    rows = [(a[k], b[k]) for k in cats] + ([(sum(a[k] for k in rare), sum(b[k] for k in rare))] if rare else [])
    na, nb = sum(x for x, _ in rows), sum(y for _, y in rows)
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    dof = max(1, len(rows) - 1)
    return _chi2_sf(stat, dof), dof


@contract(
    "SPEC-SAMPLING-DISTRIBUTION", f"{SOURCE}: acceptance (speculative sampling)", rules=("S3",), needs=("engine",),
    rule=f"With temperature {TEMPERATURE} and top_k {TOP_K}, the tokens the first verify commits (positions 2 and 3) follow "
    f"the target's distribution: {SAMPLES} seeded samples with MTP and without pass a two-sample chi-square test at "
    f"false-alarm rate {ALPHA}, for the oracle and the distilled draft.",
)
def spec_sampling_distribution(subject) -> None:
    prompt = random_prompts(subject.tiny_model(MODEL), [6], 13)[0]

    def reqs(seed0: int) -> list[GenRequest]:
        return [GenRequest(prompt, max_new_tokens=3, temperature=TEMPERATURE, top_k=TOP_K, seed=seed0 + i)
                for i in range(SAMPLES)]

    ref = subject.generate(_torch_native(subject), reqs(0))
    for draft in ("assistant_oracle", "assistant_distilled"):
        got = subject.generate(_torch_native(subject, *_spec(subject, draft)), reqs(10**6))
        for pos in (1, 2):
            a = Counter(tuple(o.output_ids[: pos + 1]) for o in ref.outputs)
            b = Counter(tuple(o.output_ids[: pos + 1]) for o in got.outputs)
            p, dof = two_sample_chi2(a, b)
            require(
                p >= ALPHA,
                f"draft {draft}: tokens 1..{pos + 1} with MTP do not follow the target's distribution (chi-square p={p:.2e} "
                f"< {ALPHA}, {dof} dof); most frequent without MTP {a.most_common(4)}, with {b.most_common(4)}",
            )


@contract("SPEC-KV-FREED", f"{SOURCE}: rejected KV freed", rules=("S4",), needs=("engine",))
def spec_kv_freed(subject) -> None:
    """With MTP, after every request ends no KV slot is held (rejected draft rows are freed at once, a request
    finishing mid-round frees its rows past its last token) and the radix cache passes its integrity check, with
    the radix cache on and off and under a KV pool small enough to retract requests."""
    ps = random_prompts(subject.tiny_model(MODEL), [30, 12, 45, 7, 19], 14)
    reqs = [GenRequest(p, max_new_tokens=10) for p in ps]
    reqs += [GenRequest(p, max_new_tokens=9, temperature=1.0, seed=i) for i, p in enumerate(ps)]
    ref = subject.generate(_torch_native(subject, "--disable-radix-cache"), reqs[: len(ps)])
    for draft in ("assistant_distilled", "assistant"):
        for flags in ((), ("--disable-radix-cache",), ("--max-total-tokens", "120", "--chunked-prefill-size", "16")):
            out = generate_freeing_kv(subject, _torch_native(subject, *flags, *_spec(subject, draft)), reqs,
                                      f"draft {draft}, flags {flags}")
            _same_tokens(f"draft {draft}, flags {flags} (greedy requests)", ref,
                         type(out)(outputs=out.outputs[: len(ps)], work={}))
