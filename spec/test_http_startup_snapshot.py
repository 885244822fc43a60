"""Startup-log snapshots of a real launched server (syrupy), fast prefill off and on.

The log is that of ``python -m impl.launch_server`` up to its ready line, as the
``http`` capability launches it (``contracts.adapters.impl_http``), reduced to
the ``impl`` loggers and normalised: no timestamps, ports, paths, checkpoint
hashes or version numbers. Update with
``pytest spec/test_http_startup_snapshot.py --snapshot-update`` after an intended change.
"""

from __future__ import annotations

import re

import pytest

from contracts.http_support import ARGV_OFF, ARGV_ON

CASES = {"flag_off": ARGV_OFF, "flag_on": ARGV_ON}
LINE = re.compile(r"^\[[^\]]+\] (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<msg>.*)$")


def normalise(log: str) -> str:
    out = []
    for raw in log.splitlines():
        m = LINE.match(raw)
        if not m or not (m["logger"] == "impl" or m["logger"].startswith("impl.")):
            continue
        msg = m["msg"]
        msg = re.sub(r"(/[^\s',)]+)+/([\w.-]+)", r"<models>/\2", msg)  # absolute paths -> <models>/<folder>
        msg = re.sub(r"\b([a-z0-9_]+)-[0-9a-f]{12}\b", r"\1-<hash>", msg)  # tiny checkpoint folder hashes
        msg = re.sub(r"http://[\d.]+:\d+", "http://127.0.0.1:<port>", msg)
        msg = re.sub(r"yoco-gemma4 [\w.+-]+", "yoco-gemma4 <version>", msg)
        # the fused CPU kernels build only where a C++ toolchain exists (tests/engine checks the line)
        msg = re.sub(r"^CPU kernels: .*$", "CPU kernels: <fused or torch ops>", msg)
        # measured sizes (peak RSS, weights, KV pool): tests/args/test_dtype_and_memory.py checks the line
        msg = re.sub(r"^Memory: peak RSS .*$", "Memory: peak RSS <measured>", msg)
        # the C library's allocator setting (glibc or not, IMPL_MALLOC_KEEP): tests/engine/test_allocator.py checks it
        msg = re.sub(r"^Allocator: .*$", "Allocator: <the C library's setting>", msg)
        # the warm-up's wall time (tests/engine/test_warmup.py checks the warm-up)
        msg = re.sub(r"^(Warm-up: .* decode step in )[\d.]+ s", r"\1<measured> s", msg)
        # likewise the triton backend's compiled CPU attention kernels (else: the torch reference, with the reason)
        msg = re.sub(r"^Attention kernels: triton backend, (CPU kernels \(compiled.*\)|torch reference .*)$",
                     "Attention kernels: triton backend, <CPU kernels or torch reference>", msg)
        out.append(f"{m['level']} {m['logger']}: {msg}")
    return "\n".join(out)


@pytest.mark.needs("impl", "http")  # the snapshot records this project's server's own startup log
@pytest.mark.parametrize("case", sorted(CASES))
def test_http_startup_log(case, subject, snapshot):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the snapshot records the CPU startup (device, dtype and backends differ on CUDA)")
    from contracts.adapters.impl_http import startup_log

    text = normalise(startup_log(CASES[case]))
    assert "ready to roll" in text
    assert text == snapshot
