"""fp8 KV caches (issue 25): ``--kv-cache-dtype fp8_e4m3 / fp8_e5m2`` store K/V in fp8 with a per-layer scale
(1.0, or ``--quantization-param-path``'s) and every attention path dequantises in the kernel.

Agreement with bf16 KV is stated on two checkpoints. Its threshold (how many greedy sequences equal bf16's) comes
from the trained ``e2b_markov``, where agreement means what it means on a real model (the random ``e2b`` turns
any KV rounding into other greedy tokens: bf16 KV against float32 KV 3 of 24 sequences equal): the accuracy
yardstick's figures (``make accuracy``, docs/accuracy.md: 32 prompts x 64 tokens) less a margin. The trained
model barely reads its KV, though (a Markov language: a K scale misread 8x, or e5m2 bytes read as e4m3, still
agree on 20 of 24 short sequences), so what catches a misread fp8 KV is ``e2b_calm`` (the E2B structure, a
well-conditioned random init): there every divergence from bf16 must be a near tie and a token both choose
keeps its logprob. YOCO parity (flag on == flag off) holds in every KV dtype and is checked on the random
``e2b`` with non-unit scales.

Rule ids V<n> (issue 25's acceptance items): V1 fp8 KV in every attention path, dequantised in the kernel;
V2 greedy agreement with bf16 KV; V3 YOCO parity in every KV dtype.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from contracts.base import contract, require, violation
from contracts.models import random_prompts
from contracts.subject import GenRequest
from contracts.yoco_engine import FLAG, LENGTHS, _argv as _yoco_argv, _compare

ISSUE = "issue 25 (fp8 KV caches)"
AGREEMENT_MODEL = "e2b_calm"  # the per-token checks (near ties, same-token logprobs)
NEW_TOKENS = 8
THRESHOLD_MODEL = "e2b_markov"  # the agreement threshold: the accuracy yardstick's checkpoint and shape
YARDSTICK_PROMPTS, YARDSTICK_TOKENS = 32, 64
NEAR_TIE = 0.6  # nats: bf16's top token vs fp8's choice, in bf16's own distribution
SCALES = {"agreement": 2.0, "parity": 0.5}  # powers of two: a scale changes no rounding but the range


@dataclass(frozen=True)
class Agreement:
    """What one fp8 format promises against bf16 KV."""

    min_identical: int  # THRESHOLD_MODEL: greedy sequences (of YARDSTICK_PROMPTS x YARDSTICK_TOKENS) equal to bf16's
    tie_steps: int  # AGREEMENT_MODEL: divergences at steps below this must be near ties
    same_token_logprob: float  # AGREEMENT_MODEL, nats: logprob change of a token both choose, before any divergence


# min_identical: the yardstick's measured figure on e2b_markov (docs/accuracy.md, "Lossy settings on e2b_markov":
# e4m3 20 of 32 identical, e5m2 15 of 32, AMD EPYC avx2) less a margin of 4 sequences (1/8 of them) for other
# CPUs' kernels (AVX-512 / AMX round differently). On e2b_calm (this engine, CPU kernels): e4m3 22 of 24
# identical, both divergences at 0.05 / 0.17 nats, same-token changes <= 0.65 nats over 8 tokens (also with
# scales 2.0); e5m2 (2 mantissa bits) 12 of 24 identical, the 11 divergences in the first 6 tokens at <= 0.51
# nats, one at step 7 at 1.98, same-token changes <= 0.96.
AGREEMENT = {"fp8_e4m3": Agreement(16, NEW_TOKENS, 0.8), "fp8_e5m2": Agreement(11, 4, 1.2)}


def write_scale_file(dest: str, model_path: str, scale: float, kv_cache_dtype: str = "fp8_e4m3",
                     num_layers: int | None = None) -> str:
    """Write a ``--quantization-param-path`` file (SGLang's / vLLM's schema) giving every layer ``scale`` to
    ``dest``; returns ``dest``."""
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    layers = num_layers or len(text.get("layer_types") or ()) or int(text["num_hidden_layers"])
    dtype = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}[kv_cache_dtype]
    body = {"model_type": text.get("model_type", cfg.get("model_type")),
            "kv_cache": {"dtype": dtype, "scaling_factor": {"0": {str(i): scale for i in range(layers)}}}}
    with open(dest, "w") as f:
        json.dump(body, f, sort_keys=True)
    return dest


@contextmanager
def scale_file(model_path: str, scale: float, kv_cache_dtype: str = "fp8_e4m3",
               num_layers: int | None = None) -> Iterator[str]:
    """A scale file (``write_scale_file``) in a temporary folder that is removed on exit: contracts leave
    nothing behind."""
    with tempfile.TemporaryDirectory(prefix="yoco-kv-scales-") as d:
        yield write_scale_file(os.path.join(d, "kv_scales.json"), model_path, scale, kv_cache_dtype, num_layers)


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@contract(
    "KV-FP8-GREEDY-AGREEMENT", f"{ISSUE}: greedy outputs with fp8 KV equal bf16 KV up to near-ties", rules=("V1", "V2"), needs=("engine",),
    rule=f"On the trained tiny E2B checkpoint ({THRESHOLD_MODEL}, {YARDSTICK_PROMPTS} sentences of its language x "
    f"{YARDSTICK_TOKENS} greedy tokens, the accuracy yardstick's shape), greedy outputs with fp8 KV equal those with "
    "bf16 KV on at least " + ", ".join(f"{a.min_identical} (fp8_{n[4:]})" for n, a in AGREEMENT.items())
    + f" of {YARDSTICK_PROMPTS} prompts. On the well-conditioned random one ({AGREEMENT_MODEL}, {NEW_TOKENS} tokens, "
    f"24 prompts, also with a scale file: scales {SCALES['agreement']}) divergences are near ties (bf16's top "
    f"token and fp8's choice within {NEAR_TIE} nats in bf16's distribution; e5m2: in the first "
    f"{AGREEMENT['fp8_e5m2'].tie_steps} tokens), and tokens both choose keep their logprobs within "
    + " / ".join(f"{a.same_token_logprob}" for a in AGREEMENT.values()) + " nats.",
    note=f"The random tiny checkpoints say nothing about agreement (module docstring). Thresholds: the yardstick's "
    f"figures on {THRESHOLD_MODEL} (docs/accuracy.md: e4m3 20 of 32, e5m2 15 of 32) less 4. Measured on "
    f"{AGREEMENT_MODEL}: e4m3 22 of 24 identical (divergences at 0.05 / 0.17 nats), e5m2 12 of 24 (its two mantissa "
    "bits; one late divergence at 1.98 nats); bf16 KV against float32 KV 23 of 24.",
)
def fp8_greedy_agreement(subject) -> None:
    path = subject.tiny_model(AGREEMENT_MODEL)
    ps = random_prompts(path, LENGTHS, seed=0)
    base = ["--model-path", path, "--disable-radix-cache"]
    bf16_argv = base + ["--kv-cache-dtype", "bf16"]
    bf16 = subject.generate(bf16_argv, [GenRequest(p, max_new_tokens=NEW_TOKENS, return_logprob=True) for p in ps])
    with scale_file(path, SCALES["agreement"]) as scales:
        _agree_with_bf16(subject, ps, base, bf16_argv, bf16, scales)
    _agreement_on_trained(subject)


def _agreement_on_trained(subject) -> None:
    """The yardstick's greedy agreement on THRESHOLD_MODEL against AGREEMENT's min_identical."""
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS
    from impl.checkpoint_factory.markov_language import yardstick_prompts

    path = subject.tiny_model(THRESHOLD_MODEL)
    ps = yardstick_prompts(path, TINY_CHECKPOINTS[THRESHOLD_MODEL].seed, YARDSTICK_PROMPTS, seed=0)
    base = ["--model-path", path, "--disable-radix-cache", "--dtype", "float32"]

    def greedy(kv: str) -> list[list[int]]:
        reqs = [GenRequest(p, max_new_tokens=YARDSTICK_TOKENS, ignore_eos=True) for p in ps]
        return [o.output_ids for o in subject.generate(base + ["--kv-cache-dtype", kv], reqs).outputs]

    bf16 = greedy("bf16")
    for dtype, spec in AGREEMENT.items():
        identical = sum(a == b for a, b in zip(bf16, greedy(dtype)))
        if identical < spec.min_identical:
            raise violation(f"{dtype} on {THRESHOLD_MODEL}: {identical} of {len(ps)} greedy sequences "
                            f"({YARDSTICK_TOKENS} tokens) equal bf16 KV's, expected >= {spec.min_identical} (the "
                            "accuracy yardstick's figure less 4, docs/accuracy.md)")


def _agree_with_bf16(subject, ps, base, bf16_argv, bf16, scales: str) -> None:
    variants = [  # the scale file first: a misapplied scale fails there
        (f"fp8_e4m3 scales {SCALES['agreement']}", ["--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", scales]),
        ("fp8_e4m3", ["--kv-cache-dtype", "fp8_e4m3"]),
        ("fp8_e5m2", ["--kv-cache-dtype", "fp8_e5m2"]),
    ]
    for name, flags in variants:
        spec = AGREEMENT[name.split()[0]]
        run = subject.generate(base + flags, [GenRequest(p, max_new_tokens=NEW_TOKENS, return_logprob=True) for p in ps])
        for i, (p, a, b) in enumerate(zip(ps, bf16.outputs, run.outputs)):
            k = _first_divergence(a.output_ids, b.output_ids)
            for step in range(NEW_TOKENS if k is None else k):
                d = abs(a.output_logprobs[step] - b.output_logprobs[step])
                require(d <= spec.same_token_logprob, f"{name}: prompt {i} step {step}: the same token has logprob "
                        f"{b.output_logprobs[step]:.4f} vs {a.output_logprobs[step]:.4f} with bf16 KV ({d:.3f} nats > "
                        f"{spec.same_token_logprob}): fp8 KV is read wrong (scale, format or dequantisation)")
            if k is None or k >= spec.tie_steps:
                continue
            # bf16's logprob of fp8's token at the divergence, teacher-forced over the same prefix
            forced = p + a.output_ids[:k] + [b.output_ids[k]]
            tf = subject.generate(bf16_argv, [GenRequest(forced, max_new_tokens=1, return_logprob=True,
                                                         logprob_start_len=len(forced) - 1)])
            lp = tf.outputs[0].input_logprobs[-1]
            gap = a.output_logprobs[k] - (lp if lp is not None else float("-inf"))
            require(gap <= NEAR_TIE, f"{name}: prompt {i} diverges at step {k} ({b.output_ids[k]} instead of bf16's "
                    f"{a.output_ids[k]}) where bf16 ranks fp8's token {gap:.3f} nats below its own: not a near tie "
                    f"(<= {NEAR_TIE})")


@contract(
    "KV-FP8-YOCO-PARITY", f"{ISSUE}; seeds/000 PR-B: parity with the flag", rules=("V3", "F13", "F15"), needs=("engine",),
    rule=f"With fp8 KV (e4m3 and e5m2, per-layer scale {SCALES['parity']}), greedy tokens with {FLAG} on equal those with it "
    "off and logprobs agree as in float32 (24 prompts batched; e4m3 also with chunked prefill and radix hits): the "
    "parity holds in every KV dtype.",
)
def fp8_yoco_parity(subject) -> None:
    from contracts.yoco_engine import MODEL, prompts

    path = subject.tiny_model(MODEL)
    reqs = [GenRequest(p, max_new_tokens=4, return_logprob=True) for p in prompts(path)]
    edge = [GenRequest(p, max_new_tokens=3, return_logprob=True) for p in prompts(path, [1, 9, 40, 57, 33, 70], seed=1)]
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        with scale_file(path, SCALES["parity"], dtype) as scales:
            _parity_in(subject, dtype, ["--kv-cache-dtype", dtype, "--quantization-param-path", scales], reqs, edge)


def _parity_in(subject, dtype: str, kv: list[str], reqs: list[GenRequest], edge: list[GenRequest]) -> None:
    off = subject.generate(_yoco_argv(subject, "--disable-radix-cache", *kv), reqs)
    on = subject.generate(_yoco_argv(subject, "--disable-radix-cache", *kv, FLAG), reqs)
    _compare(f"{dtype}, batched", off, on)
    if dtype != "fp8_e4m3":
        return
    chunked = ("--chunked-prefill-size", "16", *kv)
    off = subject.generate(_yoco_argv(subject, *chunked), edge + edge, batched=False)
    on = subject.generate(_yoco_argv(subject, *chunked, FLAG), edge + edge, batched=False)
    require(any(o.cached_tokens > 0 for o in on.outputs[len(edge):]), "repeated prompts must hit the radix cache")
    _compare(f"{dtype}, chunked prefill and radix hits", off, on)
