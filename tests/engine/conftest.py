"""Engine tests: helpers live in engine_helpers.py (a unique module name; conftest names clash across folders)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from engine_helpers import all_engines  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _integrity_after_session():
    yield
    for e in all_engines():
        e.check_integrity()
