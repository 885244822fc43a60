"""Engine tests: every engine the helpers built (tests/helpers/engines.py) passes its integrity check at the end."""

from __future__ import annotations

import pytest

from tests.helpers.engines import all_engines


@pytest.fixture(scope="session", autouse=True)
def _integrity_after_session():
    yield
    for e in all_engines():
        e.check_integrity()
