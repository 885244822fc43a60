"""Every spec test runs or is skipped naming what the subject lacks.

``@pytest.mark.needs("http", "models")`` declares the capabilities a test uses (``contracts.base.CAPABILITIES``);
a subject without one skips the test before it starts. A test that meets a capability it did not declare
(``contracts.subject.MissingCapability``), an option the subject lacks (``OutOfScope``) or a run that decides
nothing (``Inconclusive``) is skipped with that verdict and reason too (``contracts.base.NotApplicable``). ``spec/test_subject_kinds.py`` proves it for the three kinds of subject.
"""

from __future__ import annotations

import pytest

from contracts.base import CAPABILITIES, NotApplicable
from contracts.subject import not_reached


def missing_needs(item: pytest.Item, capabilities: frozenset[str]) -> list[str]:
    """The capabilities ``item`` declares (``needs`` markers) that ``capabilities`` lacks."""
    needs: set[str] = set()
    for m in item.iter_markers("needs"):
        unknown = set(m.args) - CAPABILITIES
        if unknown:
            raise ValueError(f"{item.nodeid}: unknown capabilities {sorted(unknown)} in @pytest.mark.needs")
        needs |= set(m.args)
    return sorted(needs - capabilities)


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
