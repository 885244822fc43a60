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
