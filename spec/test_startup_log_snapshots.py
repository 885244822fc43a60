"""Startup-log snapshots (syrupy): the normalised log of argument resolution for each fast-prefill case.

Normalised: no timestamps or paths (model folders are shown by name). Update with
``pytest spec/test_startup_log_snapshots.py --snapshot-update`` after an intended change.
"""

from __future__ import annotations

import pytest

from contracts.models import argv_for

FLAG = "--kv-sharing-fast-prefill"
CASES = {
    "flag_off": argv_for("gemma-4-E2B-it"),
    "flag_on": argv_for("gemma-4-E2B-it", FLAG),
    "flag_on_triton": argv_for("gemma-4-E2B-it", FLAG, "--attention-backend", "triton"),
    "nextn_promotion": argv_for("gemma-4-E2B-it", FLAG, "--speculative-algorithm", "NEXTN", draft="gemma-4-E2B-it-assistant"),
    "reject_non_gemma4": argv_for("Llama-3.1-8B-Instruct", FLAG),
    "reject_torch_native": argv_for("gemma-4-E2B-it", FLAG, "--attention-backend", "torch_native"),
    "reject_prefill_backend": argv_for("gemma-4-E2B-it", FLAG, "--prefill-attention-backend", "torch_native"),
    "reject_no_shared_layers": argv_for("gemma-4-31B-it", FLAG),
    "reject_eagle": argv_for("gemma-4-E2B-it", FLAG, "--speculative-algorithm", "EAGLE"),
    "reject_eagle3": argv_for("gemma-4-E2B-it", FLAG, "--speculative-algorithm", "EAGLE3"),
    "reject_nextn_non_assistant": argv_for("gemma-4-E2B-it", FLAG, "--speculative-algorithm", "NEXTN", draft="Llama-3.1-8B-Instruct"),
}


def normalise(text: str, argv: list[str]) -> str:
    for i, tok in enumerate(argv):
        if argv[i - 1:i] in (["--model-path"], ["--speculative-draft-model-path"]):
            text = text.replace(tok, "<models>/" + tok.rstrip("/").rsplit("/", 1)[-1])
    return text


@pytest.mark.needs("impl", "args")  # the snapshots record this engine's wording
@pytest.mark.parametrize("case", sorted(CASES))
def test_startup_log(case, subject, snapshot):
    argv = CASES[case]
    out = subject.check(argv)
    lines = [f"{lv} {normalise(m, argv)}" for lv, m in out.log]
    if out.error is not None:
        lines.append(f"{type(out.error).__name__}: {normalise(str(out.error), argv)}")
    assert "\n".join(lines) == snapshot
