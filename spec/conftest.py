"""Every spec test runs or is skipped naming what the subject lacks.

``@pytest.mark.needs("http", "models")`` declares the capabilities a test uses (``contracts.base.CAPABILITIES``);
a subject without one skips the test before it starts. A test that meets a capability it did not declare
(``contracts.subject.MissingCapability``), an option the subject lacks (``OutOfScope``) or a run that decides
nothing (``Inconclusive``) is skipped with that verdict and reason too (``contracts.base.NotApplicable``). ``spec/test_subject_kinds.py`` proves it for the three kinds of subject.
"""

from __future__ import annotations

import pytest

from contracts.base import CAPABILITIES, Contract, NotApplicable, get_contract
from contracts.subject import not_reached

# Capabilities whose checks start engines, servers or timed runs: a spec test that uses one is in the slow tier
# (left out of `make test-fast`); the argument contracts and their mutants, and the catalogue's checks, stay fast.
SLOW_NEEDS = frozenset({"engine", "http", "bench", "faults", "models", "cuda"})


def missing_needs(item: pytest.Item, capabilities: frozenset[str]) -> list[str]:
    """The capabilities ``item`` declares (``needs`` markers) that ``capabilities`` lacks."""
    needs: set[str] = set()
    for m in item.iter_markers("needs"):
        unknown = set(m.args) - CAPABILITIES
        if unknown:
            raise ValueError(f"{item.nodeid}: unknown capabilities {sorted(unknown)} in @pytest.mark.needs")
        needs |= set(m.args)
    return sorted(needs - capabilities)


def _contract_of(item: pytest.Item) -> Contract | None:
    """The contract a parametrized spec test runs (``contract`` or ``cid`` parameter), if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("contract"), Contract):
        return params["contract"]
    return get_contract(params["cid"]) if isinstance(params.get("cid"), str) else None


def needs_of(item: pytest.Item) -> set[str]:
    """What a spec test uses: its ``needs`` markers, and the needs of the contract it runs."""
    needs = {cap for m in item.iter_markers("needs") for cap in m.args}
    contract = _contract_of(item)
    return needs | set(contract.needs) if contract is not None else needs


def pytest_collection_modifyitems(config, items):
    for item in items:
        needs = needs_of(item)
        if needs & SLOW_NEEDS:
            item.add_marker(pytest.mark.slow)
        if "bench" in needs:  # timed side by side: make test runs them after the rest, with no worker beside them
            item.add_marker(pytest.mark.timed)


@pytest.fixture(autouse=True)
def _declared_needs(request):
    if request.node.get_closest_marker("needs") is None:
        return
    subject = request.getfixturevalue("subject")
    missing = missing_needs(request.node, subject.capabilities)
    if missing:
        pytest.skip(f"not reached: {not_reached(subject.name, missing)}")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    try:
        return (yield)
    except NotApplicable as e:
        pytest.skip(f"{e.verdict}: {e}")  # contracts.conformance reads the verdict back from the reason
