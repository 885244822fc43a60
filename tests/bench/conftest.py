"""A real server for the load-generator tests (the launch line the HTTP contracts use, so the process is shared)."""

from __future__ import annotations

import pytest

from contracts.http_support import ARGV_OFF


@pytest.fixture(scope="session")
def url() -> str:
    from contracts.adapters.impl_http import base_url

    return base_url(ARGV_OFF)
