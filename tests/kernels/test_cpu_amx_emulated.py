"""The AMX paths on a CPU without AMX: both C++ extensions rebuilt with the tile instructions emulated in software
(``IMPL_CPU_AMX_EMULATE=1``: impl/kernels/cpu_amx_emulate.h), in a child process.

A CPU without AMX never runs the tile kernels (W8A8 / W4A8 prefill on AMX-int8, attention and W8A16 / W4A16 prefill
on AMX-bf16), and CI's machines are mostly of that kind. Here the kernel tests of both extensions run on the
emulated build, where every path reports its AMX name (``quant_w8a8_prefill_isa`` "amx_int8", ``extend_isa``
"amx_bf16", ``quant_w16_prefill_isa`` "amx_bf16") and the tests expect exactly that (tests/helpers/kernel_cases.py,
``kernel_cpu_flags``): the tiles against the references and the row kernels' bits. ``make test-amx-emulated`` runs
the wider set (fused layers, quantized engines, deterministic inference, PARITY) on the same build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench.machine import cpu_flags
from impl.kernels import cpu_fused
from impl.kernels.cpp_build import march

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow  # builds both extensions again (~2 min on 2 cores)


def test_amx_paths_pass_the_kernel_tests_on_emulated_tiles():
    flags = cpu_flags()
    if not {"avx512_bf16", "avx512_vnni"} <= flags or march() != "native":
        pytest.skip("the AMX paths' other code needs AVX-512 BF16 and VNNI in a native build")
    if cpu_fused.load() is None:
        pytest.skip(f"fused CPU kernels not built here: {cpu_fused.error()}")
    env = dict(os.environ, IMPL_CPU_AMX_EMULATE="1")
    env.pop("IMPL_CPU_AMX", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/quant/test_quant_kernels.py", "tests/kernels/test_cpu_attn.py"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    assert re.search(r"\d+ passed", out.stdout) and "skipped" not in out.stdout.splitlines()[-1], tail
