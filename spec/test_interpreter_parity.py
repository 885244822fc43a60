"""PARITY-GREEDY once more with the triton backend's kernels under the Triton interpreter.

On CPU the triton backend runs the compiled CPU kernels (``test_contracts.py`` covers every
contract that way); this run keeps the Triton kernels themselves covered by the same contract,
through ``IMPL_TRITON_KERNELS=interpreter`` and engines private to the test. The interpreter runs the
contract on the prompt lengths around the tiny model's 16-token sliding window (``WINDOW_LENGTHS``: 1, 2,
15, 16, 17, 33 and 80 tokens) instead of all 24: every leg (batched and one by one in float32, batched in
bfloat16) with a quarter of the interpreter's time (~4 min on a Zen 1 EPYC for 24 prompts).
"""

from __future__ import annotations

import pytest
import torch

from contracts.base import all_contracts


@pytest.mark.needs("impl", "engine", "models")  # the kernel provider is chosen in process
def test_parity_greedy_on_the_interpreter(subject, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("on CUDA the Triton kernels run compiled in test_contracts.py")
    from contracts import yoco_engine
    from contracts.adapters.impl_engine import engine_for, isolated_engines
    from contracts.yoco_engine import _argv

    (contract,) = [c for c in all_contracts() if c.id == "PARITY-GREEDY"]
    monkeypatch.setenv("IMPL_TRITON_KERNELS", "interpreter")
    monkeypatch.setattr(yoco_engine, "LENGTHS", yoco_engine.WINDOW_LENGTHS)
    with isolated_engines():
        engine, log = engine_for(_argv(subject, "--kv-sharing-fast-prefill", "--disable-radix-cache"))
        line = "Attention kernels: triton backend, Triton kernels under the interpreter"
        assert any(line in msg for _, msg in log), f"no {line!r} in the startup log {log}"
        assert engine.get_server_info()["attention_kernels"]["prefill"] == {"backend": "triton",
                                                                           "provider": "interpreter"}
        contract.run(subject)
