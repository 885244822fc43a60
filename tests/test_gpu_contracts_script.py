"""scripts/gpu_contracts.py, the engine-contract step of `make gpu-check`, kept working on CPU-only CI.

It runs on a GPU box only in the rare session that has one, so a broken import or selection would otherwise be found
there, with the device time already spent (the first H100 run, 2026-12-05, lost a run to such seams).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_contracts.py")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_contracts", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_default_selection_runs_fast_prefill_first_and_leaves_cpu_only_contracts_out():
    ids = [c.id for c in _module().engine_contracts([])]
    assert ids[:3] == ["KV-FP8-YOCO-PARITY", "PARITY-EDGE-BATCHES", "PARITY-GREEDY"]
    assert "WORK-CROSS-DECODER-ROWS" in ids and "SPEC-GREEDY-PARITY" in ids
    assert "QUANT-PARITY" not in ids  # its engines run with --device cpu wherever it runs
    assert not any(i.startswith(("HTTP-", "THRU-", "FLAG-")) for i in ids)  # servers, timed runs, argument rules


def test_unknown_contract_ids_are_named():
    with pytest.raises(SystemExit, match=r"unknown contract ids \['NO-SUCH'\]"):
        _module().engine_contracts(["PARITY-GREEDY", "NO-SUCH"])


def test_a_failing_contract_fails_the_run_and_the_others_still_run(monkeypatch, capsys):
    mod = _module()

    class Stub:
        def __init__(self, cid, error):
            self.id, self.error = cid, error

        def run(self, subject):
            if self.error:
                raise self.error

    monkeypatch.setattr(mod, "engine_contracts", lambda ids: [Stub("A", AssertionError("broken")), Stub("B", None)])
    assert mod.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL: AssertionError: broken" in out and '"B": "pass"' in out


@pytest.mark.slow  # starts engines
def test_one_engine_contract_passes_through_the_script():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, SCRIPT, "WORK-CROSS-DECODER-ROWS"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == '{"WORK-CROSS-DECODER-ROWS": "pass"}'
