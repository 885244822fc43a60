"""Seed 000 PR-C / rule F16: throughput thresholds as contracts (``needs={"bench"}``).

Fast prefill must be fast, not only correct: PARITY and WORK cannot fail a fast prefill
that computes every row and then throws most away; these can.

How they stay reliable on a shared, noisy 2-core machine:
* flag off and on are measured **interleaved** (off, on, on, off, ...), after one
  untimed warmup of each, on the same prompts;
* each figure is a **ratio inside one pair**, and the contract judges the **median**
  over ``PAIRS`` pairs (``PAIRS_WALL`` on a wall clock): no absolute time is compared with anything;
* thresholds sit a stated margin below what the implementation reaches;
* a failing figure is **measured again once** before the contract fails, and the
  failure prints every pair of both attempts;
* a threshold is this project's (the seed measures, it sets no bar): a failure is of
  a project rule; on a wall clock (servers by URL) a second attempt whose pairs fall
  on both sides of the threshold is inconclusive (the machine's noise decides it), not
  a failure of the engine.

Subjects time with their own clock: in process the ``impl`` subject reports the
process's CPU time (other jobs' load does not inflate it); against servers by URL
(``--subject URL --subject-fast-prefill URL``) the streaming client's wall clock.

Backends chosen for the in-process run: prefill on ``triton`` (fast prefill lives
there), decode on ``torch_native`` in both launches (pure decode batches take the
normal path with the flag on, so the flag is the only difference). On CPU the triton
backend runs the compiled SIMD kernels, so a layer costs a fixed Python / launch share
plus its arithmetic: the shapes below are chosen so the arithmetic dominates and the
real speedups sit far from both the thresholds and the mutants (medians of 5 pairs in
process, ``python -m contracts.throughput --mutants``; AMD EPYC, 2 cores, AVX-512):

===========================  ===========  ====================  ==========
figure                       real         threshold             mutant
===========================  ===========  ====================  ==========
prefill speedup, 512 tokens  1.97x        1.35x (0.4 of 2.84x)  0.98x
summarisation tok/s on/off   1.46x        1.20x                 1.0x
decode TPOT on/off           0.93x        <= 1.25x              2.0x
===========================  ===========  ====================  ==========

At the earlier shapes (a 128-token prompt, 8 summarisation requests) per-layer overhead
left the real figures at 1.33x (threshold 1.36x) and 1.1-1.3x (threshold 1.2x): CI failed
on a noisy machine although nothing regressed.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from contracts.base import ContractViolation, contract, inconclusive, note, violation
from contracts.flops import flop_bound
from contracts.subject import GenRequest, TimedOutput

SOURCE = "seeds/000 PR-C (benchmark: chat 1k/1k, summ 8k/1k; TTFT, TPOT, tok/s flag off vs on)"
FLAG = "--kv-sharing-fast-prefill"
MODEL = "e2b"  # tiny E2B-shaped checkpoint: 35 layers, 20 KV-shared
PAIRS = 5  # on the process CPU clock (in process): single runs vary by +-20% on a shared VM
PAIRS_WALL = 5  # on a wall clock (servers by URL): other jobs' load shows up, so more pairs
# How each contract below judges, and whose thresholds they are
JUDGED = f"median of {PAIRS} interleaved pairs ({PAIRS_WALL} by URL), measured again once before failing."
OURS = "the seed measures the scenarios; the thresholds are this project's"

# THRU-PREFILL-SPEEDUP: a PREFILL_LEN-token prompt, TTFT flag off / on. The saving 1 - on/off must reach
# PREFILL_FRACTION of the FLOP bound's saving 1 - 1/bound. Measured in process at 512 tokens: about 0.76 of
# it (speedup ~2x of 2.84x), so 0.4 leaves a wide margin; a fast prefill that saves nothing scores ~0. (At 128
# tokens the 20 back-half layers' fixed cost on two rows held the speedup to ~1.33x, 0.38 of the bound.)
PREFILL_LEN = 512
PREFILL_FRACTION = 0.4
# THRU-DECODE-NO-REGRESSION: DECODE_REQS one-token prompts (prefill takes the same path either way, so only
# decode differs), DECODE_TOKENS new tokens; median TPOT with the flag on may exceed flag off by at most
# DECODE_MARGIN (measured in process: on/off 0.94-1.06 per pair, median ~1.0).
DECODE_REQS, DECODE_TOKENS, DECODE_MARGIN = 4, 64, 0.25
# THRU-SUMM-SCENARIO: summarisation 8k/1k scaled by SUMM_SCALE (64 in / 8 out), SUMM_REQS requests at once;
# output tok/s flag on / off must reach 1 + SUMM_MARGIN. Sixteen requests, so the prompts weigh in the run as
# in a real summarisation batch (decode steps are shared and cost about the same for 8 or 16 rows, prefill is
# not): measured 1.4-1.8x per pair in process, median ~1.46x; the slowed-decode mutant ~1.0x. With eight requests
# the real figure was 1.1-1.3x after the other THRU contracts had run: too close to 1.2x.
SUMM_SCALE, SUMM_REQS, SUMM_MARGIN = 1 / 128, 16, 0.2
# Untimed warmup of each launch before the pairs: builds the engine and its lazy kernels.
WARMUP = GenRequest([16 + i for i in range(8)], max_new_tokens=2)


def _argv(subject: Any, flag: bool) -> list[str]:
    model = ["--model-path", subject.tiny_model(MODEL)] if "models" in subject.capabilities else []
    return [*model, "--attention-backend", "triton", "--decode-attention-backend", "torch_native",
            "--disable-radix-cache", *([FLAG] if flag else [])]


def _prompts(cfg: dict[str, Any], lengths: Sequence[int], seed: int) -> list[list[int]]:
    vocab = int(cfg.get("vocab_size") or 256)
    rng = random.Random(seed)
    return [[rng.randrange(16, vocab) for _ in range(n)] for n in lengths]


@dataclass
class Pairs:
    """Per-pair figures (flag off, flag on) and the judged ratio (median over pairs)."""

    what: str
    off: list[float]
    on: list[float]
    clock: str = "process_cpu"

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.off, self.on)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def show(self) -> str:
        pairs = ", ".join(f"{a:.4g}/{b:.4g}" for a, b in zip(self.off, self.on))
        return f"{self.what} off/on per pair: {pairs}; ratios {', '.join(f'{r:.3f}' for r in self.ratios)}; median {self.ratio:.3f}"


def _interleaved(subject: Any, requests: list[GenRequest], figure: Callable[[list[TimedOutput]], float], what: str) -> Pairs:
    argv = {False: _argv(subject, False), True: _argv(subject, True)}
    clock = {subject.timed_generate(argv[flag], [WARMUP])[0].clock for flag in (False, True)}
    out = Pairs(what, [], [], "process_cpu" if clock == {"process_cpu"} else "wall")
    for i in range(PAIRS if clock == {"process_cpu"} else PAIRS_WALL):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {flag: figure(subject.timed_generate(argv[flag], requests)) for flag in order}
        out.off.append(got[False])
        out.on.append(got[True])
    return out


# Called with every measurement (``python -m contracts.throughput`` prints them; None in tests).
on_measure: Callable[[Pairs], None] | None = None


def _judge(measure: Callable[[], Pairs], ok: Callable[[Pairs], bool], explain: Callable[[Pairs], str],
           need: str = "") -> None:
    """Pass on the first good measurement; otherwise measure again once and fail with both. A pass notes the
    passing measurement (and ``need``, the threshold), so a report shows the figures of a pass too."""
    first = measure()
    if on_measure:
        on_measure(first)
    if ok(first):
        note(first.show() + (f" ({need})" if need else ""))
        return
    second = measure()
    if on_measure:
        on_measure(second)
    if ok(second):
        note(f"attempt 2: {second.show()}" + (f" ({need})" if need else "") + f"; attempt 1: {first.show()}")
        return
    evidence = f"{explain(second)}\n  attempt 1: {first.show()}\n  attempt 2: {second.show()}"
    singles = [Pairs(second.what, [a], [b], second.clock) for a, b in zip(second.off, second.on)]
    if second.clock == "wall" and any(ok(p) for p in singles):
        raise inconclusive(f"on a wall clock the pairs fall on both sides of the threshold "
                           f"({sum(ok(p) for p in singles)} of {len(singles)} pairs pass): noise decides it. {evidence}")
    raise violation(evidence, project=True)


def _median(xs: list[float | None], what: str) -> float:
    vals = [x for x in xs if x is not None]
    if not vals:
        raise ValueError(f"no {what} to take a median of")
    return statistics.median(vals)


@contract(
    "THRU-PREFILL-SPEEDUP", SOURCE, rules=("F16",), needs=("bench",),
    rule=f"On a {PREFILL_LEN}-token prompt, TTFT with the flag on is lower than with it off by at least "
    f"{PREFILL_FRACTION:.0%} of the saving the model's prefill FLOP bound allows (1 - on/off >= "
    f"{PREFILL_FRACTION} x (1 - 1/bound)); {JUDGED}",
    stricter=OURS,
)
def prefill_speedup(subject) -> None:
    cfg = subject.model_config(_argv(subject, True))
    bound = flop_bound(cfg, PREFILL_LEN)
    need = PREFILL_FRACTION * (1 - 1 / bound)
    reqs = [GenRequest(p, max_new_tokens=1) for p in _prompts(cfg, [PREFILL_LEN], 11)]

    def saving(p: Pairs) -> float:
        return 1 - 1 / p.ratio

    _judge(
        lambda: _interleaved(subject, reqs, lambda outs: outs[0].ttft, "TTFT (s)"),
        lambda p: saving(p) >= need,
        lambda p: (f"fast prefill saved {saving(p):.1%} of the TTFT (speedup {p.ratio:.2f}x) on a {PREFILL_LEN}-token "
                   f"prompt; the FLOP bound {bound:.2f}x allows {1 - 1 / bound:.1%} and the contract requires "
                   f"{PREFILL_FRACTION:.0%} of that ({need:.1%}). Fast prefill must skip the cross-decoder's work on "
                   f"rows that do not feed the LM head, not only discard their results."),
        f"required: a TTFT saving of {need:.1%}, i.e. the off/on median >= {1 / (1 - need):.2f}: "
        f"{PREFILL_FRACTION:.0%} of the {1 - 1 / bound:.1%} the FLOP bound {bound:.2f}x allows",
    )


@contract(
    "THRU-DECODE-NO-REGRESSION", SOURCE, rules=("F16",), needs=("bench",),
    rule=f"On decode-dominated requests ({DECODE_REQS} one-token prompts, {DECODE_TOKENS} new tokens each), median TPOT "
    f"with the flag on is at most {1 + DECODE_MARGIN:.2f}x flag off; {JUDGED}",
    stricter=OURS,
)
def decode_no_regression(subject) -> None:
    cfg = subject.model_config(_argv(subject, False))
    reqs = [GenRequest(p, max_new_tokens=DECODE_TOKENS) for p in _prompts(cfg, [1] * DECODE_REQS, 12)]

    def on_over_off(p: Pairs) -> float:
        return 1 / p.ratio

    _judge(
        lambda: _interleaved(subject, reqs, lambda outs: _median([o.tpot for o in outs], "TPOT"), "median TPOT (s)"),
        lambda p: on_over_off(p) <= 1 + DECODE_MARGIN,
        lambda p: (f"median TPOT with the flag on is {on_over_off(p):.2f}x flag off on decode-only requests (allowed "
                   f"{1 + DECODE_MARGIN:.2f}x): decode batches must take the normal path with fast prefill on."),
        f"required: TPOT on/off <= {1 + DECODE_MARGIN:.2f}, i.e. the off/on median >= {1 / (1 + DECODE_MARGIN):.2f}",
    )


@contract(
    "THRU-SUMM-SCENARIO", SOURCE, rules=("F16",), needs=("bench",),
    rule=f"The summarisation scenario (8k in / 1k out scaled by {SUMM_SCALE:g}: {round(8192 * SUMM_SCALE)} / "
    f"{round(1024 * SUMM_SCALE)}, {SUMM_REQS} requests at once) has at least {1 + SUMM_MARGIN:.2f}x the output tok/s "
    f"with the flag on as off; {JUDGED}",
    stricter=OURS,
)
def summ_scenario(subject) -> None:
    cfg = subject.model_config(_argv(subject, False))
    n_in, n_out = round(8192 * SUMM_SCALE), round(1024 * SUMM_SCALE)
    reqs = [GenRequest(p, max_new_tokens=n_out) for p in _prompts(cfg, [n_in] * SUMM_REQS, 13)]

    def tok_s(outs: list[TimedOutput]) -> float:
        return sum(o.output_tokens for o in outs) / max(o.latency for o in outs)

    # Pairs hold tok/s, so on/off is the inverse of Pairs.ratio (off/on).
    _judge(
        lambda: _interleaved(subject, reqs, tok_s, "output tok/s"),
        lambda p: 1 / p.ratio >= 1 + SUMM_MARGIN,
        lambda p: (f"summarisation-shaped output tok/s with the flag on is {1 / p.ratio:.2f}x flag off (required "
                   f"{1 + SUMM_MARGIN:.2f}x): long prompts with short outputs must gain from fast prefill."),
        f"required: tok/s on/off >= {1 + SUMM_MARGIN:.2f}, i.e. the off/on median <= {1 / (1 + SUMM_MARGIN):.3f}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the THRU contracts and print every measurement:
    ``python -m contracts.throughput`` (in process) or ``... --subject URL --subject-fast-prefill URL``."""
    import argparse
    import os

    ap = argparse.ArgumentParser(prog="python -m contracts.throughput", description=main.__doc__)
    ap.add_argument("--subject", default="impl")
    ap.add_argument("--subject-fast-prefill", default=None)
    ap.add_argument("--mutants", action="store_true",
                    help="also run each THRU contract against the mutants that claim it (in process only)")
    args = ap.parse_args(argv)
    if args.mutants and args.subject != "impl":
        ap.error("--mutants patches this project's engine in process: use it with --subject impl")
    if args.subject == "impl":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import torch

        torch.set_num_threads(1)
    from contracts.adapters import make_subject

    global on_measure
    subject = make_subject(args.subject, args.subject_fast_prefill)
    on_measure = lambda p: print(f"  {p.show()}", flush=True)  # noqa: E731
    failed = 0
    checks = {"THRU-PREFILL-SPEEDUP": prefill_speedup, "THRU-DECODE-NO-REGRESSION": decode_no_regression,
              "THRU-SUMM-SCENARIO": summ_scenario}
    for cid, fn in checks.items():
        print(f"{cid} ({subject.name}):", flush=True)
        try:
            fn(subject)
            print("  passed", flush=True)
        except ContractViolation as e:
            failed += 1
            print(f"  FAILED: {e}", flush=True)
    if args.mutants:
        import contextlib

        from contracts.mutants import all_mutants

        for m in all_mutants():
            for cid in sorted(set(m.kills) & set(checks)):
                print(f"{cid} against mutant {m.name} (must fail):", flush=True)
                try:
                    with getattr(subject, "isolated", contextlib.nullcontext)():
                        checks[cid](m.make(subject))
                    failed += 1
                    print("  PASSED: the mutant survived", flush=True)
                except ContractViolation as e:
                    print(f"  killed: {str(e).splitlines()[0]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
