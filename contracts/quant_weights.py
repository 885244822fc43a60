"""Issue 32: fast prefill stays exact with quantized weights.

QUANT-PARITY: for every weight format the engine serves (int8 W8A8, int8 and int4 weight-only, int4 weights with
int8 activations, quantized while the checkpoint loads: ``--torchao-config``; and W8A8 with the KV-shared layers in
W4A8, ``--torchao-config-kv-shared``) and both KV dtypes (the model's and
fp8_e4m3), greedy tokens and logprobs with ``--kv-sharing-fast-prefill`` equal those without it (logprobs within the PARITY contracts'
float32 bound), whole prompts and chunked, batched and one by one. The flag changes how many rows the
cross-decoder runs on; a quantized kernel whose result for a row depended on the rows beside it (an
activation scale per batch instead of per token) would break it. (Measured: the quantized kernels are
row-invariant, W8A8 exactly so; the float parts of the engine are not bit for bit batch-invariant without
--enable-deterministic-inference, so the bound is the PARITY contracts'.) The quantized kernels are CPU kernels
(a CUDA device refuses the formats at startup, with that message), so the engines run with --device cpu on any
machine.
"""

from __future__ import annotations

from contracts.base import contract
from contracts.yoco_engine import FLAG, LOGPROB_TOL, MODEL, _argv, _compare, prompts
from contracts.subject import GenRequest

FORMATS = (("--torchao-config", "int8dq"), ("--torchao-config", "int8wo"), ("--torchao-config", "int4wo-32"),
           ("--torchao-config", "8da4w-32"),
           # two formats in one model: the KV-shared layers (the rows the flag cuts) in W4A8, the rest W8A8
           ("--torchao-config", "int8dq", "--torchao-config-kv-shared", "8da4w-32"))
KV = ((), ("--kv-cache-dtype", "fp8_e4m3"))
LENGTHS = [1, 5, 9, 16, 17, 33, 41, 64]


@contract(
    "QUANT-PARITY", "seeds/000 PR-B: per-prompt parity test; issue 32: fast prefill stays exact in every weight format",
    rules=("F13", "F15"), needs=("engine",),
    rule="With quantized weights (int8 W8A8, int8 and int4 weight-only, int4 W4A8) and both KV dtypes, greedy tokens "
    "with the flag "
    f"on equal those with it off and logprobs agree within {LOGPROB_TOL} (whole prompts and chunked, batched and "
    "one by one).",
    stricter=f"logprobs agree within {LOGPROB_TOL} in every quantized format",
)
def quant_parity(subject) -> None:
    ps = prompts(subject.tiny_model(MODEL), lengths=LENGTHS, seed=3)
    reqs = [GenRequest(p, max_new_tokens=4, return_logprob=True) for p in ps]
    for fmt in FORMATS:
        for kv in KV:
            base = ("--device", "cpu", "--disable-radix-cache", *fmt, *kv)
            off = subject.generate(_argv(subject, *base), reqs, batched=True)
            on = subject.generate(_argv(subject, *base, FLAG), reqs, batched=True)
            _compare(f"{' '.join(base)}: flag off vs on", off, on)
            if not kv:
                a_off = subject.generate(_argv(subject, *base), reqs, batched=False)
                a_on = subject.generate(_argv(subject, *base, FLAG), reqs, batched=False)
                _compare(f"{' '.join(base)}: one by one, flag off vs on", a_off, a_on)
            chunked = ("--chunked-prefill-size", "16", *base)
            c_off = subject.generate(_argv(subject, *chunked), reqs, batched=True)
            c_on = subject.generate(_argv(subject, *chunked, FLAG), reqs, batched=True)
            _compare(f"{' '.join(chunked)}: flag off vs on", c_off, c_on)
