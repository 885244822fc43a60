"""What grammar masking adds to a batch-16 decode step of a real-size model, end to end in the engine.

Issue 34's bound: masking adds at most 10% to a batch-16 decode step at full vocabulary size on the full-size
checkpoint. ``bench/bench_structured.py`` times the mask's pieces alone; this runs the engine itself: 16
requests decode together, unconstrained and then each under a JSON schema that cannot complete within the run
(a string of at least 400 characters), interleaved ``--rounds`` times, and compares the scheduler's mean time per
pure decode step (the rounds' means, and each round's ratio: the machine's drift moves whole rounds) (``decode_step_times``: forward, mask fill and apply, sampling, bookkeeping) between the two.

    python -m bench.bench_structured_e2e --model e2b-full-wc [--rounds 2] [--new-tokens 12]
"""

from __future__ import annotations

import argparse
import json
import os

from bench.machine import cpu_description

SCHEMA = json.dumps({"type": "object", "properties": {"text": {"type": "string", "minLength": 400}}, "required": ["text"]})


def _path(model: str) -> str:
    if os.path.isdir(model):
        return model
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    return tiny_checkpoint(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=32)
    a = ap.parse_args()
    from impl import Engine

    e = Engine(_path(a.model), random_seed=0, disable_radix_cache=True, context_length=1024,
               max_running_requests=a.batch)
    prompts = [[2 + (7 * i + 13 * j) % 5000 for j in range(a.prompt_len)] for i in range(a.batch)]
    per: dict[str, list[float]] = {"plain": [], "json_schema": []}
    try:
        for _ in range(a.rounds):
            for kind in per:
                sp = dict(max_new_tokens=a.new_tokens, temperature=0, ignore_eos=True)
                if kind == "json_schema":
                    sp["json_schema"] = SCHEMA
                before = e.get_server_info()["decode_step_times"]
                out = e.generate(input_ids=prompts, sampling_params=sp)
                after = e.get_server_info()["decode_step_times"]
                steps = after["steps"] - before["steps"]
                ms = 1e3 * (after["total_s"] - before["total_s"]) / max(steps, 1)
                assert all(len(o["output_ids"]) == a.new_tokens for o in out), [len(o["output_ids"]) for o in out]
                per[kind].append(ms)
                print(f"{kind}: {steps} decode steps, {ms:.1f} ms per step", flush=True)
    finally:
        e.shutdown()
    plain, masked = per["plain"], per["json_schema"]
    pairs = sorted(m / p for p, m in zip(plain, masked))
    mean = (sum(masked) / len(masked)) / (sum(plain) / len(plain))
    print(f"\nCPU: {cpu_description()}; model {a.model}; batch {a.batch}")
    print(f"decode step, mean of {a.rounds} interleaved rounds: plain {sum(plain) / len(plain):.1f} ms, every row under a "
          f"JSON schema {sum(masked) / len(masked):.1f} ms: masking adds {100 * (mean - 1):+.1f}% (per round "
          f"{', '.join(f'{100 * (r - 1):+.1f}%' for r in pairs)}; median {100 * (pairs[len(pairs) // 2] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
