"""Property: the flag refuses exactly where seed 000 says and otherwise changes nothing (the subject's decision
with the flag against its own decision without it); a refusal is a ValueError naming a flag."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.base import CommandLineRefused, OutOfScope
from contracts.models import MODELS, model_dir

FLAG = "--kv-sharing-fast-prefill"
BACKENDS = (None, "triton", "torch_native", "flashinfer", "fa3")
ALGOS = (None, "EAGLE", "EAGLE3", "NEXTN")
DRAFTS = (None, "assistant", "llama", "gemma")


def _gemma_dir(n_shared: int) -> str:
    root = os.path.join(tempfile.gettempdir(), f"yoco-property-models-{os.getuid()}", f"gemma4-shared{n_shared}")
    cfg = dict(MODELS["gemma-4-E2B-it"], num_kv_shared_layers=n_shared, use_double_wide_mlp=n_shared > 0)
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "config.json")
    if not os.path.isfile(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(cfg, f)
        os.replace(tmp, path)
    return root


def flag_allows(arch, n_shared, backend, prefill, algo) -> bool:
    """Seed 000's flag rules alone (Behaviour), written independently of impl: True when turning the flag on may
    keep a command line's decision. Nothing about the engine's own rules without the flag (which drafts NEXTN
    takes, say): the property compares the subject's decision with the flag to its own decision without it."""
    if arch != "gemma4" or n_shared == 0:
        return False
    effective_prefill = prefill or backend or "triton"  # unset resolves to triton
    if effective_prefill != "triton":
        return False
    return algo not in ("EAGLE", "EAGLE3")


def argv_of(arch, n_shared, backend, prefill, decode, algo, draft) -> list[str]:
    model = _gemma_dir(n_shared) if arch == "gemma4" else model_dir(
        {"llama": "Llama-3.1-8B-Instruct", "qwen2": "Qwen2.5-7B-Instruct"}[arch]
    )
    argv = ["--model-path", model]
    for opt, val in (("--attention-backend", backend), ("--prefill-attention-backend", prefill),
                     ("--decode-attention-backend", decode), ("--speculative-algorithm", algo)):
        if val is not None:
            argv += [opt, val]
    if draft is not None:
        drafts = {"assistant": "gemma-4-E2B-it-assistant", "llama": "Llama-3.1-8B-Instruct", "gemma": "gemma-4-E2B-it"}
        argv += ["--speculative-draft-model-path", model_dir(drafts[draft])]
    return argv


def judge(subject, arch, n_shared, backend, prefill, decode, algo, draft) -> None:
    """The flag refuses exactly where the seed says and otherwise changes nothing: with the flag the subject
    accepts iff it accepts without it and the seed's flag rules allow it; a refusal is a ValueError naming a flag."""
    if FLAG not in subject.cli_options():
        raise OutOfScope(f"the subject has no {FLAG}, which this property is about", (FLAG,))
    argv = argv_of(arch, n_shared, backend, prefill, decode, algo, draft)
    try:
        off = subject.check(argv)  # anything but ValueError/RuntimeError propagates and fails the property
        on = subject.check([*argv, FLAG])
    except CommandLineRefused as e:  # an engine without the flag: a failed property, not a crash
        raise AssertionError(f"{argv}: the subject's command line refused it: {e}") from e
    expected = off.accepted and flag_allows(arch, n_shared, backend, prefill, algo)
    assert on.accepted == expected, (
        f"{argv} + {FLAG}: without the flag the subject {'accepts' if off.accepted else 'refuses'} "
        f"({off.error!r}); the seed's flag rules {'allow' if flag_allows(arch, n_shared, backend, prefill, algo) else 'refuse'} "
        f"it; with the flag it {'accepts' if on.accepted else 'refuses'} ({on.error!r})")
    if on.error is not None:
        assert isinstance(on.error, ValueError), repr(on.error)
        assert "--" in str(on.error), f"rejection must name a flag: {on.error}"


EXAMPLE = st.fixed_dictionaries(dict(
    arch=st.sampled_from(["gemma4", "llama", "qwen2"]),
    n_shared=st.sampled_from([0, 1, 5, 20]),
    backend=st.sampled_from(BACKENDS),
    prefill=st.sampled_from(BACKENDS),
    decode=st.sampled_from(BACKENDS),
    algo=st.sampled_from(ALGOS),
    draft=st.sampled_from(DRAFTS),
))


@pytest.mark.needs("args")
@settings(max_examples=100, deadline=None, report_multiple_bugs=False)
@given(example=EXAMPLE)
@pytest.mark.slow  # hypothesis over every argument combination
def test_flag_decision_is_differential(subject, example):
    judge(subject, **example)


@pytest.mark.needs("impl")  # the mutant patches this project's engine in process
@pytest.mark.parametrize("mutant", ["AcceptsEagle", "AcceptsAnyBackend", "AcceptsNoSharedLayers"])
@pytest.mark.slow  # the property run again per mutant
def test_property_kills_a_mutant(subject, mutant):
    """The differential property still fails a subject that lets the flag through where the seed refuses it."""
    import contextlib

    from contracts.mutants import all_mutants

    broken = next(m for m in all_mutants() if m.name == mutant).make(subject)
    examples = [dict(arch="gemma4", n_shared=20, backend=None, prefill=None, decode=None, algo="EAGLE", draft=None),
                dict(arch="gemma4", n_shared=20, backend="torch_native", prefill=None, decode=None, algo=None, draft=None),
                dict(arch="gemma4", n_shared=0, backend="triton", prefill=None, decode=None, algo=None, draft=None)]
    failed = 0
    with getattr(subject, "isolated", contextlib.nullcontext)():
        for ex in examples:
            try:
                judge(broken, **ex)
            except AssertionError:
                failed += 1
    assert failed, f"{mutant} passed every example of the differential property"
