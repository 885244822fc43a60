"""bench/profile_step.py's phases are the calls a real forward makes: on a tiny model's prefill the profiler finds
the attention inputs, the attention kernels and the after-attention call, and the table's rows add up to the
wall time."""

from __future__ import annotations

from bench import profile_step
from impl import Engine
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


def test_phases_found_in_a_real_prefill():
    eng = Engine(model_path=tiny_checkpoint("e2b"), kv_sharing_fast_prefill=True, random_seed=0)
    try:
        sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
        ids = [(7 + 31 * i) % 200 + 3 for i in range(48)]
        eng.generate(input_ids=ids[:8], sampling_params=sp)
        eng.flush_cache()
        wall, phases = profile_step.profile_run(lambda: eng.generate(input_ids=ids, sampling_params=sp))
    finally:
        eng.shutdown()
    names = [name for name, _ in profile_step.PHASES]
    for name in names[:3]:  # attention inputs, attention kernels, after attention
        assert phases.get(name, 0.0) > 0, (name, phases)
    assert sum(phases.get(n, 0.0) for n in names) < wall
    rows = profile_step._table("Prefill", wall, phases, wall / 2, "test")
    ms = [float(r.split("|")[2]) for r in rows if r.startswith("| ") and not r.startswith("| phase")]
    assert abs(sum(ms) - wall * 1e3) < 0.5 + 1e-3 * len(ms) * 10  # the rest is the wall time not covered
    assert "50% of it" in rows[0]
