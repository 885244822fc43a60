"""Acceptance: every registered contract against the chosen subject."""

from __future__ import annotations

import pytest

from contracts.base import all_contracts

CONTRACTS = all_contracts()


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.id for c in CONTRACTS])
def test_contract(contract, subject):
    missing = contract.needs - subject.capabilities
    if missing:
        pytest.skip(f"subject {subject.name} lacks capabilities {sorted(missing)}")
    contract.run(subject)
