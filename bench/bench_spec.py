"""Speculative decoding (FROZEN_KV_MTP) vs plain decoding, same run, same prompts (not a test).

Target: ``e2b_markov``, the tiny E2B-shaped checkpoint trained on a seeded synthetic Markov
language (``impl/checkpoint_factory/markov_language.py``); prompts are sentences of that language (held out:
other seeds than the target's training and the draft's distillation data). Engines (float32,
greedy, EOS ignored), built once each:
* ``base``: no speculation;
* ``mtp``: NEXTN -> FROZEN_KV_MTP with the assistant distilled from the target (``assistant_markov``), chain 3;
* ``mtp-oracle``: the same loop and the same assistant forwards (their cost is paid), but the
  proposed tokens are the target's own greedy tokens (taken from the base run): every draft is
  accepted, so this row is the loop's ceiling at acceptance length ``steps + 1``;
* ``mtp-random``: the random-weight assistant (``assistant``): every draft rejected, the loop's floor.

Per batch size (1 and 16) the engines run alternately ``--rounds`` times; each round's numbers
are decode output tok/s (tokens after each request's first, over the time from the first
token to the last) and median TPOT; the table shows each system's median over rounds, the
ratio to ``base`` in the same round (median), and the mean acceptance length (tokens committed
per verify). ``--backend triton`` runs the triton prefill backend (which verify batches use)
with ``--kv-sharing-fast-prefill`` on every engine (decode on torch_native); the startup line names
the kernels it runs (on a CPU-only machine: compiled CPU kernels when available, else the interpreter).

Usage: ``python -m bench.bench_spec [--backend torch_native|triton] [--rounds 3]`` (``make bench-spec``).
The first run builds the two on-demand checkpoints (about a minute on one core).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


import torch


class CostedOracle:
    """Runs the real drafter (its cost is paid) but proposes the target's greedy tokens (from a table)."""

    def __init__(self, real, table: dict[tuple[int, ...], list[int]]):
        self.real, self.table = real, table

    def draft(self, reqs, steps):
        self.real.draft(reqs, steps)
        return [self.table[tuple(r.fill_ids)][:steps] for r in reqs]


class Timed:
    """Wraps a bound method; records the wall time of each call (``durations``)."""

    def __init__(self, fn):
        self.fn, self.durations = fn, []

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.durations.append(time.perf_counter() - t0)


def table_from(prompts: list[list[int]], outputs: list[list[int]], steps: int) -> dict[tuple[int, ...], list[int]]:
    t = {}
    for p, o in zip(prompts, outputs):
        for k in range(1, len(o) + 1):
            t[tuple(p + o[:k])] = (o[k:] + [0] * steps)[:steps]
    return t


def decode_stats(outs: list[dict], wall_start: float) -> tuple[float, float]:
    """(decode tok/s, median TPOT): tokens after the first, from the earliest first token to the last finish."""
    firsts = [wall_start + o["meta_info"]["ttft"] for o in outs]
    ends = [wall_start + o["meta_info"]["e2e_latency"] for o in outs]
    toks = sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    tpots = [(o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"]) / (o["meta_info"]["completion_tokens"] - 1)
             for o in outs]
    return toks / (max(ends) - min(firsts)), statistics.median(tpots)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("torch_native", "triton"), default="torch_native")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from impl import Engine
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint
    from impl.checkpoint_factory.markov_language import language_for

    target, draft = tiny_checkpoint("e2b_markov"), tiny_checkpoint("assistant_markov")
    language = language_for(target, TINY_CHECKPOINTS["e2b_markov"].seed)
    kw = dict(dtype="float32", random_seed=0, disable_radix_cache=True, max_running_requests=16)
    if args.backend == "triton":
        kw.update(attention_backend="triton", decode_attention_backend="torch_native", kv_sharing_fast_prefill=True)
    else:
        kw.update(attention_backend="torch_native")
    mtp = dict(speculative_algorithm="NEXTN", speculative_draft_model_path=draft)
    rand = dict(speculative_algorithm="NEXTN", speculative_draft_model_path=tiny_checkpoint("assistant"))
    engines = {"base": Engine(target, **kw), "mtp": Engine(target, **kw, **mtp), "mtp-oracle": Engine(target, **kw, **mtp),
               "mtp-random": Engine(target, **kw, **rand)}
    print(f"bench_spec: backend {args.backend}, threads {args.threads}, prompt {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens, rounds {args.rounds}, load average {os.getloadavg()[0]:.1f} at start")
    print("  " + "; ".join(ln for ln in engines["mtp"].startup_log if ln.startswith(("Speculative", "Attention", "Triton"))))
    sp = {"max_new_tokens": args.new_tokens, "temperature": 0.0, "ignore_eos": True}
    rows, costs = [], []
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        prompts = language.prompts([args.prompt_len] * bs, 100 + bs)
        ref = engines["base"].generate(input_ids=prompts, sampling_params=sp)
        real = engines["mtp-oracle"].spec_worker.drafter
        engines["mtp-oracle"].spec_worker.drafter = CostedOracle(
            getattr(real, "real", real), table_from(prompts, [o["output_ids"] for o in ref], 3))
        for e in engines.values():  # warm-up at this batch size
            e.generate(input_ids=prompts, sampling_params={**sp, "max_new_tokens": 8})
        base, spec = engines["base"], engines["mtp"].spec_worker
        timed = [(base.scheduler, "step"), (base.runner, "forward"), (spec, "run_round"), (spec.drafter, "draft"),
                 (engines["mtp"].runner, "forward")]
        for obj, attr in timed:
            setattr(obj, attr, Timed(getattr(obj, attr)))
        per: dict[str, list[tuple[float, float, float]]] = {k: [] for k in engines}
        for _ in range(args.rounds):
            for name, e in engines.items():
                t0 = time.perf_counter()
                outs = e.generate(input_ids=prompts, sampling_params=sp)
                assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref], f"{name}: tokens differ"
                tok_s, tpot = decode_stats(outs, t0)
                acc = statistics.mean(o["meta_info"].get("spec_accept_length", 1.0) for o in outs)
                per[name].append((tok_s, tpot, acc))
        # medians: the few prefill steps among the decode / verify ones do not move them
        costs.append((bs, *(statistics.median(getattr(obj, attr).durations) for obj, attr in timed)))
        for obj, attr in timed:
            delattr(obj, attr)  # unwrap (the instance attribute hid the method)
        for name in engines:
            ratios = [r[0] / b[0] for r, b in zip(per[name], per["base"])]
            rows.append((bs, name, statistics.median(r[0] for r in per[name]), statistics.median(r[1] for r in per[name]),
                         statistics.median(ratios), min(ratios), max(ratios), statistics.median(r[2] for r in per[name])))
    print()
    print("| batch | system | decode tok/s | median TPOT (ms) | vs base (median, min-max over rounds) | accept length |")
    print("|---|---|---|---|---|---|")
    for bs, name, tok_s, tpot, ratio, lo, hi, acc in rows:
        acc_s = "-" if name == "base" else f"{acc:.2f}"
        print(f"| {bs} | {name} | {tok_s:.1f} | {tpot * 1e3:.1f} | {ratio:.2f}x ({lo:.2f}-{hi:.2f}) | {acc_s} |")
    print()
    print("Where an MTP round's time goes (`mtp` engine, medians over the measured rounds):")
    print()
    print("| batch | plain decode step (ms) | of which forward | MTP round (ms) | of which draft (3 steps) "
          "| verify forward | rest (acceptance, bookkeeping) | round / plain step |")
    print("|---|---|---|---|---|---|---|---|")
    for bs, step, fwd, rnd, dr, ver in costs:
        print(f"| {bs} | {step * 1e3:.2f} | {fwd * 1e3:.2f} | {rnd * 1e3:.2f} | {dr * 1e3:.2f} | {ver * 1e3:.2f} "
              f"| {(rnd - dr - ver) * 1e3:.2f} | {rnd / step:.2f} |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end (2-core machine shared with other jobs: ratios are "
          "same-run medians, absolute tok/s vary with the load)")
    for e in engines.values():
        e.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
