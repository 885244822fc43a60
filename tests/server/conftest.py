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


# The hardened server: small limits (so a fuzzer's largest requests stay cheap), --allow-auto-truncate,
# one allowed origin and host, no response store, and injected faults by rid (contracts/fault_injection.py: only requests
# whose rid contains 'fault-<stage>' fail). Shared by test_faults, test_schemathesis, test_soak and
# the flag checks of test_limits.
HARDENED_ARGV = ["--decode-attention-backend", "torch_native", "--context-length", "64", "--max-total-tokens", "4096",
                 "--max-n", "2", "--max-batch-size", "2", "--max-stop-strings", "2", "--max-stop-token-ids", "4",
                 "--max-logprobs", "64", "--allow-auto-truncate", "--allowed-origins", "http://app.example", "--allowed-hosts", "llm.internal"]

HARDENED_ENV = {"YOCO_RESPONSES_STORE_MB": "0"}  # and no stored Responses API responses


@pytest.fixture(scope="session")
def hardened():
    """The running hardened server (RunningServer: .url, .proc for its RSS)."""
    from contracts.adapters.impl_http import start

    server = start(HARDENED_ARGV, mutant="InjectedFaults", env=HARDENED_ENV)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hardened_url(hardened) -> str:
    return hardened.url
