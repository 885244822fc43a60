"""glibc's malloc tuned for a CPU forward (impl/engine/cpu_malloc.py): activation-sized blocks come back as the
same pages instead of fresh ones (no page fault per 4 KB per forward); the switch keeps glibc's defaults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from impl.engine import cpu_malloc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# A fresh interpreter: in a long test process the main heap may not grow in place (other mappings above it),
# and glibc then falls back to mmap whatever the threshold; a server tunes its own process at startup.
_PROBE = """
import resource, sys, torch
from impl.engine import cpu_malloc
line = cpu_malloc.tune_glibc_malloc() if sys.argv[1] == "tuned" else "defaults"
def faults(n):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(n, dtype=torch.uint8)
    t.fill_(1)  # touch every page
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
n = 48 << 20  # above glibc's largest automatic mmap threshold (32 MB): mmap'd afresh by default
faults(n)  # the heap grows once
print(line)
print(faults(n))
"""


def _second_block_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120).stdout.strip().splitlines()
    return out[-2], int(out[-1])


def test_a_freed_activation_block_is_reused_without_page_faults():
    line, tuned = _second_block_faults("tuned")
    if "reuse heap pages" not in line:
        pytest.skip(line)
    _, default = _second_block_faults("defaults")
    assert default > 10_000  # 12,288 pages of 4 KB, each a fresh page from mmap
    assert tuned < 64


def test_the_switch_keeps_glibc_defaults(monkeypatch):
    monkeypatch.setenv("IMPL_GLIBC_MALLOC_TUNING", "0")
    assert cpu_malloc.tune_glibc_malloc() == "glibc malloc: defaults (IMPL_GLIBC_MALLOC_TUNING=0)"
