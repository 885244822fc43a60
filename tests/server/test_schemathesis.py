"""schemathesis drives every route from our OpenAPI document (issue 14, item 5a).

``--checks all``: no 5xx, every answer's status, content type, headers and body conform to the document,
schema-invalid bodies are refused, schema-valid ones accepted (relaxed only where the schema cannot state
a rule: see ``schemathesis.toml``), unsupported methods get 405 with ``Allow``. Deterministic generation,
a bounded example count; the server is the hardened one (small limits keep the largest valid request cheap).
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from contracts.http_support import TIMEOUT

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_EXAMPLES = 30


def test_openapi_publishes_request_bodies(hardened_url):
    doc = httpx.get(hardened_url + "/openapi.json", timeout=TIMEOUT).json()
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/abort_request"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        name = body["$ref"].rsplit("/", 1)[1]
        assert doc["components"]["schemas"][name]["properties"], name
    sp = doc["components"]["schemas"]["SamplingParamsBody"]["properties"]
    n = next(s for s in sp["n"]["anyOf"] if s.get("type") == "integer")
    assert n["maximum"] == 2  # the server's --max-n, baked into the schema
    temp = next(s for s in sp["temperature"]["anyOf"] if s.get("type") == "number")
    assert temp["minimum"] == 0


def _schemathesis(url: str, phases: str, max_examples: int) -> None:
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", os.path.join(HERE, "schemathesis.toml"), "run",
           url + "/openapi.json", "--checks", "all", "--phases", phases, "--max-examples", str(max_examples),
           "--generation-deterministic", "--request-timeout", "60", "--no-color"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"schemathesis found problems:\n{tail}"
    assert "No issues found" in proc.stdout, tail
    assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200


def test_schemathesis_checks_all(hardened_url):
    """CI: the fuzzing phase (valid and invalid bodies), a bounded example count per operation."""
    _schemathesis(hardened_url, "fuzzing", MAX_EXAMPLES)


@pytest.mark.soak
def test_schemathesis_with_coverage_phase(hardened_url):
    """``make soak``: also the coverage phase (every boundary and every invalid variant of every field)."""
    _schemathesis(hardened_url, "examples,coverage,fuzzing", 50)
