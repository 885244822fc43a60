"""One accuracy yardstick for a lossy setting against its reference (``bench/accuracy_settings.py``).

For each setting, 32 prompts x 64 greedy tokens (EOS ignored) on the reference and on the candidate:

* greedy agreement: the candidate's greedy tokens against the reference's, as the mean common-prefix length
  and the fraction of sequences identical;
* the mean KL divergence KL(reference || candidate) of the next-token distributions along the reference's
  greedy path, teacher-forced: both engines prefill ``prompt + reference tokens`` and return every position's
  full next-token distribution (``top_logprobs_num`` = the vocabulary size, so nothing is truncated: the KL is
  exact up to float rounding). Long vocabularies are asked for a few positions per request (``--kl-elements``)
  so the lists stay small. Both engines write a position's K/V into the pool before attention reads it, so a
  teacher-forced prefill sees the same KV rounding a decode step does. Also reported: the fraction of
  positions where the candidate's top-1 is the reference's token (teacher-forced top-1), and the reference's
  own check that its teacher-forced top-1 is its greedy token (prefill vs decode rounding).

Prompts: sentences of the checkpoint's language for a trained Markov checkpoint (``e2b_markov``), random ids
otherwise. A setting is two lists of server arguments; ``--reference-args`` / ``--candidate-args`` measure one
that is not in the table yet.

``python -m bench.accuracy --model e2b_markov [--settings a,b] [--write-docs]``
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from bench.accuracy_settings import DEFAULT_SETTINGS, SETTINGS, Setting

ACCURACY_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "accuracy.md")
KL_ELEMENTS = 1 << 21  # logprob entries per teacher-forced request (positions x vocabulary)


@dataclass(frozen=True)
class SettingResult:
    setting: Setting
    prompts: int
    new_tokens: int
    identical: float  # fraction of sequences equal to the reference's
    mean_prefix: float  # mean common-prefix length (tokens)
    first_token: float  # fraction of prompts whose first greedy token agrees
    mean_kl: float  # nats, over every position of the reference's paths
    max_kl: float
    tf_top1: float  # candidate's teacher-forced top-1 == the reference's token
    reference_tf_top1: float  # the reference's own teacher-forced top-1 == its greedy token


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def kl_divergence(ref_logprobs: Sequence[float], cand_logprobs: Sequence[float]) -> float:
    """KL(p || q) in nats of two full distributions given as logprobs over the same vocabulary (float64)."""
    import torch

    p = torch.as_tensor(ref_logprobs, dtype=torch.float64)
    q = torch.as_tensor(cand_logprobs, dtype=torch.float64)
    if p.shape != q.shape:
        raise ValueError(f"distributions over {p.numel()} and {q.numel()} ids")
    keep = p > -math.inf
    return max(float((p[keep].exp() * (p[keep] - q[keep])).sum()), 0.0)


def argmax(logprobs: Sequence[float]) -> int:
    import torch

    return int(torch.as_tensor(logprobs, dtype=torch.float64).argmax())


def dense(entries: list[Any], vocab: int) -> list[float]:
    """A top-k entry list ``[(logprob, id, text), ...]`` covering the whole vocabulary -> logprobs by id."""
    out = [-math.inf] * vocab
    for e in entries:
        out[e[1]] = e[0]
    if len(entries) < vocab:
        raise ValueError(f"the engine returned {len(entries)} of {vocab} logprobs: the KL would be truncated")
    return out


# ---------------------------------------------------------------- engines


def build_engine(argv: list[str]):
    from impl import Engine
    from impl.args.server_args import ServerArgs

    args = ServerArgs.parse(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    return Engine(**given)


def greedy(engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    return [o["output_ids"] for o in outs]


def teacher_forced(engine, prompts: list[list[int]], paths: list[list[int]], vocab: int,
                   kl_elements: int = KL_ELEMENTS):
    """Yield (prompt index, position, logprobs over the vocabulary) of ``engine``'s next-token distribution at
    every position of ``paths`` (position t predicts ``paths[i][t]``), prefilling ``prompt + path[:t]``."""
    per_req = max(1, min(len(paths[0]), kl_elements // vocab))
    per_batch = max(1, kl_elements // (vocab * per_req))
    jobs = [(i, start) for i in range(len(prompts)) for start in range(0, len(paths[i]), per_req)]
    for b in range(0, len(jobs), per_batch):
        batch = jobs[b:b + per_batch]
        ids, starts = [], []
        for i, start in batch:
            end = min(start + per_req, len(paths[i])) - 1  # the last position comes from the output's top list
            ids.append(prompts[i] + paths[i][:end])
            starts.append(len(prompts[i]) + start)
        outs = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                               return_logprob=True, logprob_start_len=starts, top_logprobs_num=vocab)
        for (i, start), out in zip(batch, outs):
            meta = out["meta_info"]
            tops = list(meta["input_top_logprobs"]) + [meta["output_top_logprobs"][0]]
            for k, entries in enumerate(tops):
                yield i, start + k, dense(entries, vocab)


# ---------------------------------------------------------------- measuring


def prompts_for(model: str, path: str, n: int, seed: int, vocab: int) -> tuple[list[list[int]], str]:
    """(prompts, how they were drawn): sentences of a trained checkpoint's language, else random ids."""
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS
    from impl.checkpoint_factory.markov_language import FIRST_ID, yardstick_prompts

    recipe = TINY_CHECKPOINTS.get(model)
    if recipe is not None and recipe.kind == "trained":
        return yardstick_prompts(path, recipe.seed, n, seed), f"sentences of its Markov language (seed {seed})"
    rng = random.Random(seed)
    lengths = [rng.randint(8, 48) for _ in range(n)]
    return [[2] + [rng.randrange(FIRST_ID, vocab) for _ in range(k - 1)] for k in lengths], f"random ids (seed {seed})"


def measure(setting: Setting, path: str, prompts: list[list[int]], new_tokens: int, engines: dict,
            cache: dict, log=print) -> SettingResult:
    """Run one setting (engines are built per distinct argv and kept in ``engines``; the reference's greedy paths
    in ``cache``)."""

    def engine_for(argv: list[str]):
        key = tuple(argv)
        if key not in engines:
            log(f"  building engine: {shlex.join(argv)}")
            engines[key] = build_engine(argv)
        return engines[key]

    ref_argv, cand_argv = setting.argv("reference", path), setting.argv("candidate", path)
    ref, cand = engine_for(ref_argv), engine_for(cand_argv)
    vocab = ref.model_config.vocab_size
    if tuple(ref_argv) not in cache:
        cache[tuple(ref_argv)] = greedy(ref, prompts, new_tokens)
    ref_paths = cache[tuple(ref_argv)]
    cand_paths = greedy(cand, prompts, new_tokens)
    return score(setting, new_tokens, ref_paths, cand_paths, teacher_forced(ref, prompts, ref_paths, vocab),
                 teacher_forced(cand, prompts, ref_paths, vocab))


def measure_one_engine_at_a_time(setting: Setting, path: str, prompts: list[list[int]], new_tokens: int,
                                 log=print) -> SettingResult:
    """``measure`` with one engine in memory at a time (two bf16 engines at full size need ~24 GB): the
    reference's greedy paths and its teacher-forced distributions (float32, as the engine computes them:
    4 bytes x vocabulary per position, 2.1 GB at full size) are kept, the reference shut down, then the candidate
    runs along the same paths. The figures are ``measure``'s."""
    import gc

    import torch

    def run(argv: list[str], paths: list[list[int]] | None):
        log(f"  building engine: {shlex.join(argv)}")
        engine = build_engine(argv)
        try:
            vocab = engine.model_config.vocab_size
            own = greedy(engine, prompts, new_tokens)
            along = own if paths is None else paths
            dists = [(i, t, torch.tensor(lp, dtype=torch.float32)) for i, t, lp in teacher_forced(engine, prompts, along, vocab)]
            return own, dists
        finally:
            engine.shutdown()
            del engine
            gc.collect()

    ref_paths, ref_tf = run(setting.argv("reference", path), None)
    cand_paths, cand_tf = run(setting.argv("candidate", path), ref_paths)
    return score(setting, new_tokens, ref_paths, cand_paths, ref_tf, cand_tf)


def score(setting: Setting, new_tokens: int, ref_paths: list[list[int]], cand_paths: list[list[int]],
          ref_tf: Iterable[tuple[int, int, Sequence[float]]], cand_tf: Iterable[tuple[int, int, Sequence[float]]]
          ) -> SettingResult:
    """The figures of one setting from both sides' greedy paths and teacher-forced distributions (``ref_tf`` and
    ``cand_tf`` yield (prompt index, position, logprobs over the vocabulary) along ``ref_paths``, in the same
    order), whichever engine produced them."""
    prefixes = [common_prefix(a, b) for a, b in zip(ref_paths, cand_paths, strict=True)]
    kls: list[float] = []
    tf_agree = ref_agree = 0
    for (i, t, lp_ref), (j, u, lp_cand) in zip(ref_tf, cand_tf, strict=True):
        assert (i, t) == (j, u)
        kls.append(kl_divergence(lp_ref, lp_cand))
        tok = ref_paths[i][t]
        ref_agree += argmax(lp_ref) == tok
        tf_agree += argmax(lp_cand) == tok
    n = len(ref_paths)
    return SettingResult(
        setting=setting, prompts=n, new_tokens=new_tokens,
        identical=sum(p == new_tokens for p in prefixes) / n,
        mean_prefix=statistics.fmean(prefixes),
        first_token=sum(p > 0 for p in prefixes) / n,
        mean_kl=statistics.fmean(kls), max_kl=max(kls),
        tf_top1=tf_agree / len(kls), reference_tf_top1=ref_agree / len(kls),
    )


# ---------------------------------------------------------------- report


def table(results: list[SettingResult]) -> str:
    lines = [
        "| setting | reference args | candidate args | sequences identical | mean common prefix | first token agrees "
        "| mean KL (nats) | max KL (nats) | teacher-forced top-1 agrees |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r.setting
        lines.append(
            f"| {s.name}: {s.what} | `{shlex.join(s.reference)}` | `{shlex.join(s.candidate)}` "
            f"| {r.identical:.3f} ({round(r.identical * r.prompts)}/{r.prompts}) | {r.mean_prefix:.1f} / {r.new_tokens} "
            f"| {r.first_token:.3f} | {r.mean_kl:.2e} | {r.max_kl:.2e} | {r.tf_top1:.4f} |")
    return "\n".join(lines)


def section(model: str, results: list[SettingResult], command: str, cpu: str, prompt_note: str, seconds: float) -> str:
    refs = ", ".join(f"{r.setting.name} {r.reference_tf_top1:.4f}" for r in results)
    return "\n".join([
        f"## Lossy settings on {model}",
        "",
        f"Command: `{command}`. CPU: {cpu}. {results[0].prompts} prompts ({prompt_note}, 8-48 tokens) x "
        f"{results[0].new_tokens} greedy tokens (EOS ignored); KL(reference || candidate) at every position of the "
        f"reference's greedy paths, teacher-forced, over the full vocabulary; {seconds:.0f} s.",
        "",
        table(results),
        "",
        f"The reference's own teacher-forced top-1 equals its greedy token (prefill vs decode rounding) at: {refs}.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="e2b_markov", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                    help=f"comma-separated names of {sorted(SETTINGS)}; empty with --candidate-args")
    ap.add_argument("--reference-args", default=None, help="an ad-hoc setting: the reference's server args")
    ap.add_argument("--candidate-args", default=None, help="an ad-hoc setting: the candidate's server args")
    ap.add_argument("--name", default="ad-hoc", help="the ad-hoc setting's name")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write-docs", action="store_true", help=f"write the table into {os.path.relpath(ACCURACY_MD)}")
    ap.add_argument("--one-engine-at-a-time", action="store_true",
                    help="keep the reference's distributions instead of its engine (full size: ~12 GB instead of ~24)")
    args = ap.parse_args(argv)

    import torch

    from bench.docs_section import print_section
    from bench.machine import cpu_description
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    torch.set_num_threads(args.threads)
    settings = [SETTINGS[s] for s in args.settings.split(",") if s]
    if args.candidate_args is not None:
        settings.append(Setting(args.name, tuple(shlex.split(args.reference_args or "")),
                                tuple(shlex.split(args.candidate_args)), "ad-hoc (--candidate-args)"))
    if not settings:
        ap.error("no setting to measure")
    path = args.model if os.path.isdir(args.model) else tiny_checkpoint(args.model)
    model = os.path.basename(os.path.normpath(args.model))
    from impl.config.model_config import ModelConfig

    vocab = ModelConfig.from_pretrained(path).vocab_size
    prompts, note = prompts_for(model, path, args.prompts, args.seed, vocab)
    engines: dict = {}
    cache: dict = {}
    results = []
    t0 = time.perf_counter()
    try:
        for s in settings:
            print(f"{s.name}: {s.what}", flush=True)
            r = (measure_one_engine_at_a_time(s, path, prompts, args.new_tokens) if args.one_engine_at_a_time
                 else measure(s, path, prompts, args.new_tokens, engines, cache))
            print(f"  identical {r.identical:.3f}, mean common prefix {r.mean_prefix:.1f}/{r.new_tokens}, first token "
                  f"{r.first_token:.3f}, mean KL {r.mean_kl:.3e} (max {r.max_kl:.3e}), teacher-forced top-1 "
                  f"{r.tf_top1:.4f} (reference's own {r.reference_tf_top1:.4f})", flush=True)
            results.append(r)
    finally:
        for e in engines.values():
            e.shutdown()
    seconds = time.perf_counter() - t0
    command = "python -m bench.accuracy " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = section(model, results, command.strip(), cpu_description(), note, seconds)
    print_section(text, args.write_docs, ACCURACY_MD)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
