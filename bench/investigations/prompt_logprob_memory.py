"""Peak memory of prompt logprobs at full size: ``python -m bench.investigations.prompt_logprob_memory``.

One ``--tokens``-token prompt (random ids, greedy, one new token) with every prompt token's logprob and its
``--top`` most likely tokens (``/generate``'s ``logprob_start_len: 0``; vLLM's ``prompt_logprobs`` and the
completions' ``echo`` take the same path) on the full-size checkpoint (``e2b-full-wc``, built on demand: ~9 GB, check
free memory and disk first), once per ``--blocks`` value, each in its own process: the output processor's
``PROMPT_LOGPROB_BLOCK`` (rows whose log-softmax over the 262,144-token vocabulary is one temporary; a value at
least the chunk's rows is the whole chunk at once). Prints wall time, peak RSS before (load and a warm-up) and
after the request, and the first and last prompt logprobs (the blocks must not change them).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time

from bench.machine import cpu_description


def one(block: int, tokens: int, top: int) -> dict:
    from impl.args.server_args import ServerArgs
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint
    from impl.engine import output_processor
    from impl.server.runtime import build_engine

    output_processor.PROMPT_LOGPROB_BLOCK = block
    eng = build_engine(ServerArgs(model_path=str(tiny_checkpoint("e2b-full-wc"))))
    rng = random.Random(0)
    ids = [2] + [rng.randrange(1000, 200000) for _ in range(tokens - 1)]
    eng.generate(input_ids=ids[:64], sampling_params={"max_new_tokens": 1})  # warm
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t = time.perf_counter()
    out = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                       logprob_start_len=0, top_logprobs_num=top)
    took = time.perf_counter() - t
    lps = out["meta_info"]["input_token_logprobs"]
    eng.shutdown()
    return {"block": block, "seconds": took, "peak_before_gib": before,
            "peak_after_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "first": lps[1][0], "last": lps[-1][0], "entries": len(lps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--blocks", type=int, nargs="+", default=[256, 1 << 30])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (the child process's block)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.one, a.tokens, a.top)))
        return
    print(cpu_description())
    print("| rows per block | wall s | peak RSS before | peak RSS after | first / last prompt logprob |")
    print("|---:|---:|---:|---:|---|")
    for block in a.blocks:
        p = subprocess.run([sys.executable, "-m", "bench.investigations.prompt_logprob_memory", "--one", str(block),
                            "--tokens", str(a.tokens), "--top", str(a.top)], capture_output=True, text=True, check=True)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"| {block if block < 1 << 30 else 'the whole chunk'} | {r['seconds']:.1f} | {r['peak_before_gib']:.2f} GiB "
              f"| {r['peak_after_gib']:.2f} GiB | {r['first']:.6f} / {r['last']:.6f} |")


if __name__ == "__main__":
    main()
