"""Root fixtures: subject selection, tiny checkpoints, log capture."""

from __future__ import annotations

import os

import pytest

# Triton kernels only run interpreted without CUDA; this must be set before any
# kernel module imports triton.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # Tiny models on a shared 2-core box: a second intra-op thread only waits
    # (measured: tests/model 150 s with 2 threads, 12 s with 1).
    torch.set_num_threads(int(os.environ.get("YOCO_TEST_THREADS", "1")))
except ImportError:  # pragma: no cover
    pass


def pytest_addoption(parser):
    parser.addoption(
        "--subject",
        default="impl",
        help="implementation the contracts run against: 'impl' (in process), 'sglang' (SGLang's argument code in "
        "the virtualenv $SGLANG_VENV, default .cache/sglang-venv: make conformance-sglang), 'vllm' (vLLM's "
        "EngineArgs -> create_engine_config in $VLLM_VENV, default .cache/vllm-venv: make conformance-vllm) or the base "
        "URL of a running server",
    )
    parser.addoption(
        "--subject-fast-prefill",
        default=None,
        help="with an http:// --subject: base URL of a second server launched with --kv-sharing-fast-prefill "
        "(the THRU contracts compare the two)",
    )
    parser.addoption(
        "--subject-restart-wait",
        type=float,
        default=0.0,
        help="with an http:// --subject whose launcher restarts a server that died: seconds a contract waits for a "
        "dead server to come back before it is inconclusive (contracts/liveness.py; bench/conformance_vllm.py)",
    )


pytest_plugins = ("contracts.conformance",)

# Fixtures that start server processes (tests/server, tests/bench, tests/cluster): a test using one is in the
# slow tier, left out of `make test-fast` (spec tests are tiered by their capabilities: spec/conftest.py).
SERVER_FIXTURES = frozenset({"url", "key_url", "hardened", "hardened_url", "fault_url", "mtp_fault_url", "cluster"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def subject(request):
    """The subject under test, guarded: a capability it lacks is a skip that names it, never an AttributeError."""
    from contracts.adapters import make_subject
    from contracts.subject import CapabilityGuard

    return CapabilityGuard(make_subject(request.config.getoption("--subject"),
                                        request.config.getoption("--subject-fast-prefill"),
                                        request.config.getoption("--subject-restart-wait")))


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """tiny_checkpoint(name) -> path of a cached, deterministic HF checkpoint."""
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint as build

    return build
