"""Seed 000 (PR-B/PR-C): what fast prefill does at run time, F13-F15.

PARITY: the flag changes no output. WORK: the cross-decoder runs on exactly the
rows that feed the LM head, the self-decoder on every row. Both run the same
backends with the flag on and off (triton prefill), so the flag is the only
difference.
"""

from __future__ import annotations

from contracts.base import contract, require, violation
from contracts.models import first_difference, random_prompts, triton_prefill_argv
from contracts.subject import GenRequest

SEED = "seeds/000 PR-B"
FLAG = "--kv-sharing-fast-prefill"
MODEL = "e2b"  # tiny E2B-shaped checkpoint: 35 layers, 20 KV-shared, sliding window 16
# Output logprobs with the flag on and off agree within this bound: the flag changes
# which rows the cross-decoder runs on, not the arithmetic of any kept row, so only
# float32 reduction-order noise (~1e-6 on these logits) may differ.
LOGPROB_TOL = 1e-4
# Every PARITY contract runs in the checkpoint's dtype (the tiny checkpoints are float32) and again
# served in bfloat16 (the dtype E2B is served in): the flag must not change which token wins there either,
# where any difference in a kept row's arithmetic would be amplified, not hidden, by bf16 rounding.
# (A small KV pool for the bf16 engines: the in-process subject keeps every engine it built for the session.)
# The contracts read DTYPES when they run: spec/test_mutants.py runs them with only BF16 to show that the
# bf16 legs alone still kill each PARITY mutant.
F32 = ()
BF16 = ("--dtype", "bfloat16", "--max-total-tokens", "8192")
DTYPES = (F32, BF16)
# Prompt lengths: 1-token prompts, shorter than, equal to and longer than the window,
# several windows long. PARITY-GREEDY reads LENGTHS when it runs: spec/test_interpreter_parity.py runs it
# under the Triton interpreter on WINDOW_LENGTHS only (the same cases around the 16-token window, a quarter of
# the interpreter's time).
LENGTHS = [1, 2, 3, 5, 7, 9, 12, 15, 16, 17, 19, 23, 28, 31, 32, 33, 37, 41, 47, 52, 58, 64, 71, 80]
WINDOW_LENGTHS = [1, 2, 15, 16, 17, 33, 80]


def prompts(model_path: str, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    return random_prompts(model_path, lengths, seed)


def _argv(subject, *flags: str) -> list[str]:
    return triton_prefill_argv(subject.tiny_model(MODEL), *flags)


def _compare(what: str, off, on) -> None:
    require(len(off.outputs) == len(on.outputs), f"{what}: {len(off.outputs)} outputs with the flag off, {len(on.outputs)} on")
    for i, (a, b) in enumerate(zip(off.outputs, on.outputs)):
        if a.output_ids != b.output_ids:
            step = first_difference(a.output_ids, b.output_ids)
            raise violation(f"{what}: prompt {i}: greedy tokens differ at step {step}: flag off {a.output_ids}, flag on {b.output_ids}"
            )
        for step, (la, lb) in enumerate(zip(a.output_logprobs, b.output_logprobs)):
            require(
                abs(la - lb) <= LOGPROB_TOL,
                f"{what}: prompt {i} step {step}: output logprob {la:.6f} (off) vs {lb:.6f} (on) differ by more than {LOGPROB_TOL}",
            )
        require(len(a.input_logprobs) == len(b.input_logprobs), f"{what}: prompt {i}: prompt logprob counts differ")
        for j, (la, lb) in enumerate(zip(a.input_logprobs, b.input_logprobs)):
            if la is None or lb is None:
                require(la is None and lb is None, f"{what}: prompt {i} prompt logprob {j}: {la} vs {lb}")
                continue
            require(
                abs(la - lb) <= LOGPROB_TOL,
                f"{what}: prompt {i}: prompt logprob {j} {la:.6f} (off) vs {lb:.6f} (on) differ by more than {LOGPROB_TOL}",
            )


@contract(
    "PARITY-GREEDY", f"{SEED}: per-prompt parity test; PR-C: accuracy unchanged", rules=("F13", "F15", "F16"), needs=("engine",),
    rule="For 24 prompts of varied lengths, batched and one by one, greedy tokens with the flag on equal those with it "
    f"off and output logprobs agree within {LOGPROB_TOL}; again (batched) served in bfloat16.",
    stricter="greedy outputs do not depend on the batch (batched and one by one) and logprobs agree within 1e-4",
)
def parity_greedy(subject) -> None:
    ps = prompts(subject.tiny_model(MODEL), LENGTHS)
    reqs = [GenRequest(p, max_new_tokens=4, return_logprob=True) for p in ps]
    for dtype, batched in [(d, b) for d in DTYPES for b in ((True, False) if d == F32 else (True,))]:
        off = subject.generate(_argv(subject, "--disable-radix-cache", *dtype), reqs, batched=batched)
        on = subject.generate(_argv(subject, "--disable-radix-cache", *dtype, FLAG), reqs, batched=batched)
        _compare(f"{'batched' if batched else 'one by one'}{' '.join(('',) + dtype)}", off, on)


@contract(
    "PARITY-EDGE-BATCHES", f"{SEED}: gather -> cross-decoder -> scatter over every batch shape", rules=("F13", "F14", "F15"), needs=("engine",),
)
def parity_edge_batches(subject) -> None:
    """Chunked prefill (a chunk's last row is kept though not sampled), radix-cache hits and mixed prefill+decode
    batches give the same greedy tokens and logprobs with the flag on as off, in float32 and in bfloat16."""
    ps = prompts(subject.tiny_model(MODEL), lengths=[1, 9, 40, 57, 33, 70], seed=1)
    # Chunked prefill: 16-token chunks, so later chunks attend to a cached prefix.
    reqs = [GenRequest(p, max_new_tokens=3, return_logprob=True) for p in ps]
    for dtype in DTYPES:
        for flags in (("--chunked-prefill-size", "16", "--disable-radix-cache", *dtype), dtype):
            off = subject.generate(_argv(subject, *flags), reqs + reqs, batched=True)
            on = subject.generate(_argv(subject, *flags, FLAG), reqs + reqs, batched=True)
            _compare(f"flags {flags}", off, on)
        # Radix hits: the second copy of each prompt reuses cached prefix KV; flag off vs on over those hits.
        off2 = subject.generate(_argv(subject, *dtype), reqs + reqs, batched=False)
        on2 = subject.generate(_argv(subject, *dtype, FLAG), reqs + reqs, batched=False)
        for res in (off2, on2):
            require(any(o.cached_tokens > 0 for o in res.outputs[len(reqs):]), "repeated prompts must hit the radix cache")
        _compare(f"radix-cache hits{' '.join(('',) + dtype)}", off2, on2)


@contract(
    "PARITY-PROMPT-LOGPROBS", f"{SEED}: rows that feed the LM head include every prompt-logprob row", rules=("F13", "F15"), needs=("engine",),
    stricter="prompt logprobs with the flag on are computed (and equal), not refused",
)
def parity_prompt_logprobs(subject) -> None:
    """Prompt logprobs (from logprob_start_len) are computed with the flag on, not rejected, and equal those with the
    flag off (in float32 and in bfloat16)."""
    ps = prompts(subject.tiny_model(MODEL), lengths=[5, 20, 37], seed=2)
    reqs = [GenRequest(p, max_new_tokens=2, return_logprob=True, logprob_start_len=s) for p, s in zip(ps, (0, 3, 30))]
    # Whole prompts, then 16-token chunks (later chunks attend to a cached prefix), in each dtype.
    for flags in [("--disable-radix-cache", *d, *c) for d in DTYPES for c in ((), ("--chunked-prefill-size", "16"))]:
        off = subject.generate(_argv(subject, *flags), reqs)
        on = subject.generate(_argv(subject, *flags, FLAG), reqs)
        for o, p, s in zip(on.outputs, ps, (0, 3, 30)):
            require(len(o.input_logprobs) == len(p) - s, f"expected {len(p) - s} prompt logprobs, got {len(o.input_logprobs)}")
        _compare(f"prompt logprobs, flags {flags}", off, on)


@contract(
    "WORK-CROSS-DECODER-ROWS", f"{SEED}: the last num_kv_shared_layers layers run only on the per-request last-extend-token rows", rules=("F13",), needs=("engine",),
)
def work_cross_decoder_rows(subject) -> None:
    """On extend batches with the flag on, the cross-decoder (KV-shared layers) processes exactly the LM-head rows
    (one per request, plus prompt-logprob rows) and the self-decoder every row; with the flag off both see every
    row."""
    ps = prompts(subject.tiny_model(MODEL), lengths=[3, 4, 2, 30, 17], seed=3)
    total = sum(len(p) for p in ps)
    reqs = [GenRequest(p, max_new_tokens=1) for p in ps]  # one prefill forward, nothing else
    on = subject.generate(_argv(subject, "--disable-radix-cache", FLAG), reqs).work
    off = subject.generate(_argv(subject, "--disable-radix-cache"), reqs).work
    require(on["self_decoder_rows"] == total, f"self-decoder rows with the flag on: {on['self_decoder_rows']}, expected every row ({total})")
    require(on["cross_decoder_rows"] == len(ps), f"cross-decoder rows with the flag on: {on['cross_decoder_rows']}, expected one per request ({len(ps)})")
    require(on["lm_head_rows"] == len(ps), f"LM-head rows: {on['lm_head_rows']}, expected {len(ps)}")
    require(off["cross_decoder_rows"] == total, f"cross-decoder rows with the flag off: {off['cross_decoder_rows']}, expected {total}")
    require(on["skipped_cross_decoder_rows"] == total - len(ps), f"skipped rows: {on['skipped_cross_decoder_rows']}, expected {total - len(ps)}")
    # Prompt logprobs: every row from logprob_start_len feeds the LM head, so the cross-decoder runs on them too.
    reqs = [GenRequest(ps[3], max_new_tokens=1, return_logprob=True, logprob_start_len=10)]
    w = subject.generate(_argv(subject, "--disable-radix-cache", FLAG), reqs).work
    want = len(ps[3]) - 10 + 1  # rows 9..29: logits at row j-1 score prompt token j (10..29); row 29 the next token
    require(w["cross_decoder_rows"] == want, f"with prompt logprobs from 10 of 30 tokens the cross-decoder must run {want} rows, ran {w['cross_decoder_rows']}")
    # Decode batches take the normal path: every decode row goes through the cross-decoder.
    reqs = [GenRequest(p, max_new_tokens=3) for p in ps]
    w = subject.generate(_argv(subject, "--disable-radix-cache", FLAG), reqs).work
    require(w["cross_decoder_rows"] == 3 * len(ps), f"prefill (1 row each) + 2 decode steps must run {3 * len(ps)} cross-decoder rows, ran {w['cross_decoder_rows']}")
