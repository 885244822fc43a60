"""impl/engine/allocator.py: glibc keeps freed memory on CPU, said in the startup log; IMPL_MALLOC_KEEP=0 opts out."""

from __future__ import annotations

import platform

import pytest

from impl.engine import allocator


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)


def test_opt_out_leaves_the_defaults(fresh, monkeypatch):
    monkeypatch.setenv("IMPL_MALLOC_KEEP", "0")
    assert allocator.keep_freed_memory() == "Allocator: glibc's defaults (IMPL_MALLOC_KEEP=0)"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_glibc_keeps_freed_memory_and_says_so(fresh, monkeypatch):
    monkeypatch.delenv("IMPL_MALLOC_KEEP", raising=False)
    line = allocator.keep_freed_memory()
    assert line.startswith("Allocator: glibc keeps freed memory for reuse"), line
    assert allocator.keep_freed_memory() is line  # once per process


def test_the_engine_logs_its_allocator():
    from impl import Engine
    from impl.models_builtin import default_model_path

    eng = Engine(model_path=default_model_path(), random_seed=0)
    try:
        assert any(line.startswith("Allocator: ") for line in eng.get_server_info()["startup_log"])
    finally:
        eng.shutdown()
