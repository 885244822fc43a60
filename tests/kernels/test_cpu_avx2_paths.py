"""The AVX2 code paths on an AVX-512 machine (issue 22.3), against the same float32 references.

An AVX2-only CPU (a Zen 3) takes two things an AVX-512 machine never runs by default: oneDNN's AVX2
kernels (float32 weights prepacked for oneDNN are the default route everywhere) with no bf16 path at all
(bf16 weights then go to the extension's float32 arithmetic), and the extensions' AVX2 code (gcc's
``-march``). Here:

* ``ONEDNN_MAX_CPU_ISA=AVX2`` caps oneDNN at its AVX2 kernels without a rebuild: a child process runs the
  fused kernels' oneDNN and bf16 tests under the cap, and oneDNN's own verbose log shows which kernels ran;
* ``IMPL_CPU_MARCH=haswell`` rebuilds both extensions for AVX2 (about two minutes of compiling, so not in
  ``make test``): ``make test-avx2`` runs the kernel tests on that build, and the test below checks that a
  build carries the SIMD code its ``-march`` asks for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench.machine import cpu_flags
from impl.kernels import cpu_attn, cpu_fused
from impl.kernels.cpp_build import ENV_MARCH, march

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_builds_carry_the_simd_code_their_march_asks_for():
    """native: AVX-512 code where the CPU has it, else AVX2; IMPL_CPU_MARCH=haswell: AVX2 on any x86 CPU."""
    want = {"native": "avx512" if "avx512f" in cpu_flags() else "avx2", "haswell": "avx2"}.get(march())
    if want is None or "avx2" not in cpu_flags():
        pytest.skip(f"no expectation for {ENV_MARCH}={march()} on this CPU")
    built = {name: ext.simd_isa() for name, ext in (("cpu_fused", cpu_fused.load()), ("cpu_attn", cpu_attn.load()))
             if ext is not None}
    if not built:
        pytest.skip("no C++ toolchain here")
    assert built == {k: want for k in built}, (march(), built)


def test_kernels_under_onednn_avx2_match_the_references():
    """The fused kernels' oneDNN routes and every bf16 route with oneDNN capped at AVX2, in a child process
    (the cap is read once per process): the references still hold, bf16 weights plan onto the float32
    arithmetic (forcing oneDNN's bf16 is refused), and every primitive oneDNN ran was an AVX2 kernel."""
    if cpu_fused.load() is None:
        pytest.skip(f"fused CPU kernels not built here: {cpu_fused.error()}")
    if "avx512f" not in cpu_flags():
        pytest.skip("oneDNN already runs its AVX2 kernels here: the whole suite covers them")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ONEDNN_VERBOSE="1")
    env.pop("IMPL_CPU_LINEAR", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-s",
           "tests/kernels/test_cpu_fused.py", "-k", "onednn or linear_plan",
           "tests/kernels/test_cpu_fused_bf16.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    assert re.search(r"\d+ passed", out.stdout), tail
    # oneDNN's verbose lines: onednn_verbose,v1,primitive,exec,cpu,<kind>,<implementation>,...
    kernels = {ln.split(",")[6] for ln in out.stdout.splitlines() if ln.startswith("onednn_verbose") and ",exec,cpu," in ln}
    assert "isa:Intel AVX2" in out.stdout and any("avx2" in k for k in kernels), sorted(kernels)
    assert not any("avx512" in k or "amx" in k for k in kernels), sorted(kernels)
