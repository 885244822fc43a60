"""``make parity-full``: our Engine against transformers on the well-conditioned full-size checkpoint.

In float32, our engine with fast prefill off and on against transformers (sdpa), on prompts of 8, 600 and 1024
random ids (the last two cross the 512-token sliding window): the first generated token's top-10 logprobs within
``--tol`` (1e-3; ours' top-10 ids, each against transformers' logprob of that id; the top-1 ids equal) and the 32
greedy ids equal. Then bf16 against transformers' bf16, reported (the same figures, no threshold). One model in
memory at a time (transformers float32 at full size needs ~20 GB; ``free -g`` first, one process at a time).

``--layers N`` / ``--vocab V`` run it on a reduced copy of the recipe (``impl/checkpoint_factory/reduced.py``: the same
widths and init, written on first use), to try it before the full model. Exit status 1 when a float32 check fails.

``python -m bench.parity_full [--model e2b-full-wc] [--layers 7] [--write-docs]``
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shlex
import sys
import time
from dataclasses import dataclass

import torch

from bench.accuracy import ACCURACY_MD, common_prefix

LENGTHS = (8, 600, 1024)
NEW_TOKENS = 32
TOP = 10


@dataclass(frozen=True)
class Run:
    """One system's results on the prompts: the first token's logprobs (transformers: full; ours: top-10) and the
    greedy ids."""

    first: list[dict[int, float]]  # per prompt: token id -> logprob
    greedy: list[list[int]]


@dataclass(frozen=True)
class Row:
    comparison: str
    length: int
    max_diff: float
    same_top1: bool
    prefix: int
    checked: bool  # held to the threshold (float32) or reported (bf16)
    gap_at_divergence: float | None  # transformers' top-2 logit gap where the greedy ids part


def transformers_run(path: str, dtype: torch.dtype, prompts: list[list[int]], log) -> tuple[Run, list[list[float]]]:
    """transformers' first-token logprobs (all ids) and greedy ids, with each step's top-2 logit gap."""
    from transformers import Gemma4ForCausalLM

    t = time.perf_counter()
    model = Gemma4ForCausalLM.from_pretrained(path, dtype=dtype).eval()
    log(f"  transformers {dtype} loaded in {time.perf_counter() - t:.0f} s")
    first, greedy, gaps = [], [], []
    try:
        for p in prompts:
            with torch.no_grad():
                out = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[],
                                     output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            lp = torch.log_softmax(out.logits[0][0].double(), -1)
            first.append({i: float(v) for i, v in enumerate(lp.tolist())})
            greedy.append(out.sequences[0, len(p):].tolist())
            gaps.append([float(torch.topk(s[0].double(), 2).values.diff().abs()) for s in out.logits])
    finally:
        del model
        gc.collect()
    return Run(first, greedy), gaps


def parity_prompts(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    """The prompts: BOS then random ids of the vocabulary (above the specials), one per length."""
    rng = random.Random(seed)
    return [[2] + [rng.randrange(8, vocab) for _ in range(n - 1)] for n in lengths]


def ours_run(path: str, prompts: list[list[int]], log, **server_args) -> Run:
    """Our Engine with ``server_args`` (e.g. dtype, kv_sharing_fast_prefill): the first token's top-10 logprobs
    and the greedy ids."""
    from impl import Engine

    t = time.perf_counter()
    # (at least 1024 tokens: the hybrid pool's sliding-window share must hold one request's 512-token window, so
    # --lengths 8 alone starts too)
    engine = Engine(path, disable_radix_cache=True, random_seed=0,
                    max_total_tokens=max(1024, 4 * max(len(p) for p in prompts) + 256), **server_args)
    log(f"  ours {server_args} loaded in {time.perf_counter() - t:.0f} s")
    try:
        outs = engine.generate(input_ids=prompts, return_logprob=True, top_logprobs_num=TOP,
                               sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True})
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    first = [{e[1]: e[0] for e in o["meta_info"]["output_top_logprobs"][0]} for o in outs]
    return Run(first, [o["output_ids"] for o in outs])


def compare(name: str, ref: Run, gaps: list[list[float]], ours: Run, prompts: list[list[int]], checked: bool) -> list[Row]:
    rows = []
    for k, p in enumerate(prompts):
        top = ours.first[k]
        diff = max(abs(lp - ref.first[k][i]) for i, lp in top.items())
        ref_top1 = max(ref.first[k], key=ref.first[k].__getitem__)
        prefix = common_prefix(ref.greedy[k], ours.greedy[k])
        gap = gaps[k][prefix] if prefix < NEW_TOKENS else None
        rows.append(Row(name, len(p), diff, max(top, key=top.__getitem__) == ref_top1, prefix, checked, gap))
    return rows


def passed(row: Row, tol: float) -> bool:
    return row.max_diff <= tol and row.same_top1 and row.prefix == NEW_TOKENS


def table(rows: list[Row], tol: float) -> str:
    lines = ["| comparison | prompt tokens | first token: max abs top-10 logprob diff | top-1 same | greedy ids equal "
             "(of 32) | verdict |", "|---|---:|---:|---|---:|---|"]
    for r in rows:
        verdict = ("pass" if passed(r, tol) else "FAIL") if r.checked else "reported"
        gap = "" if r.gap_at_divergence is None else f" (transformers' top-2 gap there {r.gap_at_divergence:.3g})"
        lines.append(f"| {r.comparison} | {r.length} | {r.max_diff:.2e} | {'yes' if r.same_top1 else 'no'} "
                     f"| {r.prefix}{gap} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.parity_full", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="e2b-full-wc", help="a streamed recipe of impl.checkpoint_factory.checkpoints, or a folder")
    ap.add_argument("--layers", type=int, default=None, help="a reduced copy with this many layers (5, 7, 10, ...)")
    ap.add_argument("--vocab", type=int, default=None, help="a reduced copy with this vocabulary")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-bf16", action="store_true", help="float32 checks only")
    ap.add_argument("--write-docs", action="store_true", help=f"write the table into {os.path.relpath(ACCURACY_MD)}")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from bench.docs_section import replace_section
    from bench.machine import cpu_description
    from impl.config.model_config import ModelConfig
    from impl.checkpoint_factory.reduced import reduced_checkpoint

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if os.path.isdir(args.model):
        path = args.model
    else:
        path = reduced_checkpoint(args.model, args.layers, args.vocab, log=log)
    cfg = ModelConfig.from_pretrained(path)
    prompts = parity_prompts(cfg.vocab_size, [int(n) for n in args.lengths.split(",")], args.seed)
    what = os.path.basename(os.path.normpath(path))
    print(f"{what}: {cfg.num_hidden_layers} layers, vocabulary {cfg.vocab_size}; prompts {args.lengths}", flush=True)
    t0 = time.perf_counter()
    ref, gaps = transformers_run(path, torch.float32, prompts, log)
    rows = []
    for flag in (False, True):
        ours = ours_run(path, prompts, log, dtype="float32", kv_sharing_fast_prefill=flag)
        rows += compare(f"ours float32, fast prefill {'on' if flag else 'off'} vs transformers float32 (sdpa)",
                        ref, gaps, ours, prompts, checked=True)
    print(table(rows, args.tol), flush=True)  # the float32 verdicts before the (slower) bf16 runs
    del ref
    gc.collect()
    if not args.skip_bf16:
        ref16, gaps16 = transformers_run(path, torch.bfloat16, prompts, log)
        rows += compare("ours bf16, fast prefill off vs transformers bf16", ref16, gaps16,
                        ours_run(path, prompts, log, dtype="bfloat16"), prompts, checked=False)
    ok = all(passed(r, args.tol) for r in rows if r.checked)
    command = "python -m bench.parity_full " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"## parity-full on {what}",
        "",
        f"Command: `{command.strip()}`. CPU: {cpu_description()}. Threshold (float32): first-token top-10 logprobs "
        f"within {args.tol:g}, top-1 equal, {NEW_TOKENS} greedy ids equal. {time.perf_counter() - t0:.0f} s. "
        f"Result: {'pass' if ok else 'FAIL'}.",
        "",
        table(rows, args.tol),
        "",
    ])
    print(text)
    if args.write_docs:
        replace_section(text, ACCURACY_MD)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
