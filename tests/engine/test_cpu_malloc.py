"""glibc's malloc tuned for a CPU forward (impl/engine/cpu_malloc.py): activation-sized blocks come back as the
same pages instead of fresh ones (no page fault per 4 KB per forward); the switch keeps glibc's defaults."""

from __future__ import annotations

import resource

import pytest
import torch

from impl.engine import cpu_malloc


def _faults_of_one_block(nbytes: int) -> int:
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(nbytes, dtype=torch.uint8)
    t.fill_(1)  # touch every page
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0


def test_a_freed_activation_block_is_reused_without_page_faults():
    line = cpu_malloc.tune_glibc_malloc()
    if "reuse heap pages" not in line:
        pytest.skip(line)
    nbytes = 48 << 20  # above glibc's largest automatic mmap threshold (32 MB): mmap'd afresh by default
    _faults_of_one_block(nbytes)  # the heap grows once
    assert _faults_of_one_block(nbytes) < 64  # 12,288 pages: every one would fault if it came from mmap


def test_the_switch_keeps_glibc_defaults(monkeypatch):
    monkeypatch.setenv("IMPL_GLIBC_MALLOC_TUNING", "0")
    assert cpu_malloc.tune_glibc_malloc() == "glibc malloc: defaults (IMPL_GLIBC_MALLOC_TUNING=0)"
