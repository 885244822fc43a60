"""Property: check_server_args accepts or raises ValueError, and the decision equals a small oracle."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.base import CommandLineRefused
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


def oracle(arch, n_shared, backend, prefill, decode, algo, draft, flag) -> bool:
    """True = accept. Written from seed 000's Behaviour section, independently of impl."""
    if algo == "NEXTN" and draft != "assistant":
        return False  # NEXTN is implemented only as FROZEN_KV_MTP with a Gemma-4 assistant draft
    if algo == "NEXTN" and arch != "gemma4":
        return False  # the Gemma-4 assistant's backbone (hidden size, layer types) must match the target's
    if not flag:
        return True
    if arch != "gemma4" or n_shared == 0:
        return False
    effective_prefill = prefill or backend or "triton"  # unset resolves to triton
    if effective_prefill != "triton":
        return False
    return algo not in ("EAGLE", "EAGLE3")


@pytest.mark.needs("args")
@settings(max_examples=150, deadline=None, report_multiple_bugs=False)
@given(
    arch=st.sampled_from(["gemma4", "llama", "qwen2"]),
    n_shared=st.sampled_from([0, 1, 5, 20]),
    backend=st.sampled_from(BACKENDS),
    prefill=st.sampled_from(BACKENDS),
    decode=st.sampled_from(BACKENDS),
    algo=st.sampled_from(ALGOS),
    draft=st.sampled_from(DRAFTS),
    flag=st.booleans(),
)
@pytest.mark.slow  # hypothesis over every argument combination
def test_decision_matches_oracle(subject, arch, n_shared, backend, prefill, decode, algo, draft, flag):
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
    if flag:
        argv.append(FLAG)
    try:
        out = subject.check(argv)  # anything but ValueError/RuntimeError propagates and fails the property
    except CommandLineRefused as e:  # an engine without the flag: a failed property, not a crash
        raise AssertionError(f"{argv}: the subject's command line refused it: {e}") from e
    expected = oracle(arch, n_shared, backend, prefill, decode, algo, draft, flag)
    assert out.accepted == expected, f"{argv}: oracle says {'accept' if expected else 'reject'}, subject: {out.error!r}"
    if out.error is not None:
        assert isinstance(out.error, ValueError), repr(out.error)
        assert "--" in str(out.error), f"rejection must name a flag: {out.error}"
