"""Contract strength: every contract fails against each mutant that claims to kill it."""

from __future__ import annotations

import contextlib

import pytest

from contracts.base import ContractViolation, get_contract
from contracts.mutants import all_mutants

PAIRS = [(m, cid) for m in all_mutants() for cid in m.kills]


@pytest.mark.needs("impl")  # mutants patch this project's engine in process
@pytest.mark.parametrize("mutant,cid", PAIRS, ids=[f"{m.name}-kills-{cid}" for m, cid in PAIRS])
def test_mutant_is_killed(mutant, cid, subject):
    contract = get_contract(cid)
    missing = contract.needs - subject.capabilities
    if missing:
        pytest.skip(f"subject lacks capabilities {sorted(missing)}")
    broken = mutant.make(subject)
    # Private engines for the mutant's run: its damage must not leak into checks run later.
    with getattr(subject, "isolated", contextlib.nullcontext)(), pytest.raises(ContractViolation):
        contract.run(broken)


PARITY_PAIRS = [(m, cid) for m, cid in PAIRS if cid.startswith("PARITY-")]


@pytest.mark.needs("impl")  # mutants patch this project's engine in process
@pytest.mark.parametrize("mutant,cid", PARITY_PAIRS, ids=[f"{m.name}-kills-{cid}-in-bf16" for m, cid in PARITY_PAIRS])
def test_parity_mutant_is_killed_in_bf16_alone(mutant, cid, subject, monkeypatch):
    """The PARITY contracts' bfloat16 legs alone (the float32 ones dropped) still kill each PARITY mutant:
    bf16 rounding must not hide a kept row the flag got wrong (issue 22.6)."""
    from contracts import yoco_engine

    monkeypatch.setattr(yoco_engine, "DTYPES", (yoco_engine.BF16,))
    argvs: list[list[str]] = []
    broken = mutant.make(subject)
    real_generate = broken.generate

    def generate(argv, requests, batched=True):
        argvs.append(list(argv))
        return real_generate(argv, requests, batched)

    broken.generate = generate
    with getattr(subject, "isolated", contextlib.nullcontext)(), pytest.raises(ContractViolation):
        get_contract(cid).run(broken)
    assert argvs and all("bfloat16" in a for a in argvs), argvs  # only bf16 engines ran
