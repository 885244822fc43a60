"""Fixtures for the HTTP server tests: real servers on free loopback ports, shared with spec/.

``contracts.adapters.impl_http`` caches one server process per launch line for
the whole pytest session, so these tests and the HTTP contracts reuse the same
processes.
"""

from __future__ import annotations

import pytest

from contracts.http_support import ARGV_OFF

API_KEY = "test-key-123"


@pytest.fixture(scope="session")
def url() -> str:
    from contracts.adapters.impl_http import base_url

    return base_url(ARGV_OFF)


@pytest.fixture(scope="session")
def api_key() -> str:
    return API_KEY


@pytest.fixture(scope="session")
def key_url() -> str:
    from contracts.adapters.impl_http import base_url

    return base_url([*ARGV_OFF, "--api-key", API_KEY])
