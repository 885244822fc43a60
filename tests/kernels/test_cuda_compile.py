"""The kernels compile for an sm_90 GPU (Triton's CUDA backend runs ahead of time on CPU), within shared memory.

The interpreter accepts code the compiler rejects (loop-carried type changes,
non-constexpr globals, tl.dot shape limits); this catches it on a CPU-only CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
A100_SMEM = 166912  # bytes of shared memory per block on A100 (H100/H200 allow 232448)


@pytest.mark.slow  # compiles every kernel for CUDA
def test_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "cuda_compile_probe.py"), "bf16:80", "bf16:512", "fp32:512"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("triton's bundled ptxas is missing on this install")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 3
    for r in results:
        for kernel in ("extend", "decode", "reduce"):
            assert r[kernel] <= A100_SMEM, f"{kernel} kernel needs {r[kernel]} B of shared memory ({r})"
