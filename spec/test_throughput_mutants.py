"""Mutant (a) of issue 16 is caught by a throughput contract and by nothing else.

``FastPrefillComputesEveryRow`` gives the same tokens, logprobs and work counters as the
real fast path, so the PARITY and WORK contracts must pass against it (if one failed,
the mutant would not prove that the THRU contracts add anything). ``spec/test_mutants.py``
proves THRU-PREFILL-SPEEDUP fails against it. The full list of
non-THRU engine contracts runs with ``YOCO_THRU_SCOPE=all`` (slow); CI runs the two that
look at exactly what the mutant fakes: work counters, and greedy tokens + logprobs.
"""

from __future__ import annotations

import os

import pytest

from contracts.base import all_contracts, get_contract
from contracts.mutants import all_mutants

MUTANT = next(m for m in all_mutants() if m.name == "FastPrefillComputesEveryRow")
if os.environ.get("YOCO_THRU_SCOPE") == "all":
    SURVIVES = [c.id for c in all_contracts() if c.needs <= {"engine", "args"} and not c.id.startswith("THRU-")]
else:
    SURVIVES = ["WORK-CROSS-DECODER-ROWS", "PARITY-PROMPT-LOGPROBS"]


def test_only_throughput_contracts_claim_it():
    assert MUTANT.kills and all(cid.startswith("THRU-") for cid in MUTANT.kills), MUTANT.kills


@pytest.mark.needs("impl")
@pytest.mark.parametrize("cid", SURVIVES)
def test_mutant_passes_non_throughput_contract(cid, subject):
    # No private engines: the mutant computes correctly and leaves no damage, so it may use (and warm) the
    # engines the real contracts use; the patch is active only inside its calls.
    get_contract(cid).run(MUTANT.make(subject))
