"""Acceptance: every registered contract against the chosen subject."""

from __future__ import annotations

import pytest

from contracts.base import all_contracts, collect_notes
from contracts.liveness import watch_servers
from contracts.subject import not_reached

CONTRACTS = all_contracts()


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c.id for c in CONTRACTS])
def test_contract(contract, subject, record_property):
    missing = contract.needs - subject.capabilities
    if missing:
        raise not_reached(subject.name, missing)  # spec/conftest.py: a skip with the verdict
    with collect_notes() as notes:
        try:
            with watch_servers(contract, subject):  # a server that dies under the contract fails it (a crash)
                contract.run(subject)
        finally:
            for text in notes:  # what the run could not check, for the conformance report
                record_property("contract_note", text)
