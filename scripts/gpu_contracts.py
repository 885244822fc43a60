"""Run the engine contracts (PARITY-*, KV-*, ENGINE-*, ...) against our engine in process, outside pytest.

For the GPU check (scripts/gpu_check.sh): the GPU box holds torch, Triton, tokenizers and safetensors but not the
server's packages (fastapi, pydantic, xgrammar) that the spec suite's root conftest pulls in, so this calls each
contract's ``run`` directly with the ``impl`` subject. On CUDA the engine picks the triton backend with the
Triton kernels compiled for the GPU, so PARITY-GREEDY and friends hold the compiled kernels to flag on == flag off.

    python scripts/gpu_contracts.py [--bf16-fp32-reduction] [CONTRACT_ID ...]
        (default: every contract that needs only an engine and runs it on the GPU, fast prefill's first;
        --bf16-fp32-reduction: cuBLAS's bf16 split-K reductions in float32, to see whether the bf16 legs of the
        PARITY contracts then hold on CUDA)

Prints one line per contract (pass / fail / the NotApplicable verdict, seconds) and a JSON summary last; exits 1
when any contract failed.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

# Contracts that start engines in process and need nothing else (no server, no timed run, no fault injection).
ENGINE_NEEDS = frozenset({"engine", "args", "refuse"})
# Run first (the check has minutes, and Triton compiles every kernel variant an engine meets): fast prefill's own.
FIRST = ("PARITY-", "WORK-", "TRITON-", "KV-FP8-YOCO")
# Contracts whose engines run on the CPU wherever they are run (the quantized formats are CPU kernels): CI covers them.
CPU_ONLY = frozenset({"QUANT-PARITY"})


def engine_contracts(ids: list[str]) -> list:
    from contracts.base import all_contracts

    every = all_contracts()
    if ids:
        known = {c.id: c for c in every}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise SystemExit(f"unknown contract ids {unknown}; see docs/contracts.md")
        return [known[i] for i in ids]
    chosen = [c for c in every if "engine" in c.needs and c.needs <= ENGINE_NEEDS and c.id not in CPU_ONLY]
    return sorted(chosen, key=lambda c: (not c.id.startswith(FIRST), c.id))  # the fast-prefill ones first


def main(ids: list[str]) -> int:
    import torch

    if "--bf16-fp32-reduction" in ids:  # the experiment the first H100 run had no time for (docs/benchmarks.md)
        ids = [i for i in ids if i != "--bf16-fp32-reduction"]
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        print("cuBLAS bf16 matmuls reduce in float32 (allow_bf16_reduced_precision_reduction = False)")

    from contracts.adapters.impl_adapter import ImplSubject
    from contracts.adapters.impl_engine import isolated_engines
    from contracts.base import NotApplicable, collect_notes

    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"engine contracts on {where} (torch {torch.__version__})", flush=True)
    subject = ImplSubject()
    results: dict[str, str] = {}
    for contract in engine_contracts(ids):
        t0 = time.perf_counter()
        with collect_notes() as notes, isolated_engines():
            try:
                contract.run(subject)
                verdict = "pass"
            except NotApplicable as e:
                verdict = f"{e.verdict}: {str(e)[:300]}"
            except Exception as e:  # noqa: BLE001 - one contract's failure must not hide the others'
                verdict = f"FAIL: {type(e).__name__}: {str(e)[:1500]}"
                traceback.print_exc(limit=6)
        results[contract.id] = verdict
        note = f" (notes: {'; '.join(notes)[:300]})" if notes else ""
        print(f"{contract.id:42s} {time.perf_counter() - t0:7.1f} s  {verdict}{note}", flush=True)
    print(json.dumps(results))
    return 1 if any(v.startswith("FAIL") for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
