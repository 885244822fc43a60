"""The catalogue is complete, in sync, and every contract can fail."""

from __future__ import annotations

import re

from contracts import docs
from contracts.base import all_contracts
from contracts.mutants import all_mutants

# F<n>, K<n>: seed rules of docs/rules.md. M<n>, E<n>, T<n>, H<n>: acceptance items of the
# model (issue 4), engine (issue 5), triton (issue 6) and HTTP (issue 8) issues, which no seed states;
# S<n>: acceptance items of the speculative-decoding issue (15); R<n>: of the server-hardening issue (14);
# V<n>: of the KV-memory issue (25: fp8 KV caches, the hybrid sliding-window pool).
RULE_ID = r"[FK]\d+|[METHSRV]\d+"

# Rule ids of docs/rules.md that must be covered by at least one contract.
REQUIRED_RULES = {f"F{i}" for i in range(1, 13)} | {f"K{i}" for i in range(1, 48)} | {f"S{i}" for i in range(1, 5)}


def test_every_contract_has_a_mutant():
    killed = {cid for m in all_mutants() for cid in m.kills}
    orphans = [c.id for c in all_contracts() if c.id not in killed]
    assert not orphans, f"contracts no mutant can fail (add one in contracts/mutants/): {orphans}"


def test_mutants_name_real_contracts():
    ids = {c.id for c in all_contracts()}
    bad = [(m.name, cid) for m in all_mutants() for cid in m.kills if cid not in ids]
    assert not bad, f"mutants naming unknown contracts: {bad}"


def test_required_rules_covered():
    covered = {r for c in all_contracts() for r in c.rules}
    assert REQUIRED_RULES <= covered, f"rules without a contract: {sorted(REQUIRED_RULES - covered)}"


def test_rule_ids_well_formed():
    for c in all_contracts():
        for r in c.rules:
            assert re.fullmatch(RULE_ID, r), f"{c.id}: rule id {r!r} is not one of the documented namespaces"


def test_docs_catalogue_in_sync():
    with open(docs.path()) as f:
        current = f.read()
    assert current == docs.render(), "docs/contracts.md is stale: run `python -m contracts.docs --write`"


def test_require_names_the_running_contract():
    """``require(cond, message)`` takes the contract id from ``Contract.run``; outside a run it refuses."""
    import pytest

    from contracts.base import Contract, ContractViolation, require

    def check(subject) -> None:
        require(subject == "good", f"subject was {subject!r}")

    c = Contract("TEST-RUNNING-ID", "a rule", "here", ("T0",), frozenset({"args"}), check)
    c.run("good")
    with pytest.raises(ContractViolation, match=r"^\[TEST-RUNNING-ID\] subject was 'bad'$") as e:
        c.run("bad")
    assert e.value.contract_id == "TEST-RUNNING-ID"
    with pytest.raises(RuntimeError, match="outside a contract check"):
        require(False, "no contract runs")
