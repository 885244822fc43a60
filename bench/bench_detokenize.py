"""Scheduler-thread time spent in detokenization: this tree vs a git revision, side by side (not a test).

Workload: 32 requests x 1024 output tokens (prompts of 16 tokens, greedy, EOS
ignored) on the tiny ``e2b`` checkpoint, float32, 1 torch thread, through the
offline ``Engine.generate`` (the scheduler runs on the calling thread). Two
scenarios, each one batch:

* ``stream``: ``stream=True`` with ``stream_interval=1`` (an output per token);
* ``stop``: not streamed, every request has stop strings that never match
  (the scheduler must look for them after every token).

Every ``tokenizer.decode`` call is timed and charged to the thread that made
it: the scheduler thread (the caller's) or any other (the detokenizer stage).
``--before REV`` (default: the merge base with ``main``) is exported with
``git archive`` to a temporary folder; each round runs the revision and this
tree in fresh subprocesses, alternating, ``--rounds`` times; the table gives
medians. The final texts of every request must be equal between the two
trees (a sha256 over all of them), else the script fails.

Usage: ``python -m bench.bench_detokenize [--before REV] [--rounds 2]`` (``make bench-detokenize``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEVER_STOPS = ["<never-stop-1>", "\u2603never\u2603"]


def child(root: str, num_requests: int, output_len: int) -> dict:
    sys.path.insert(0, root)
    import torch

    import impl
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    assert os.path.abspath(impl.__file__).startswith(os.path.abspath(root)), impl.__file__
    torch.set_num_threads(1)
    eng = Engine(tiny_checkpoint("e2b"), dtype="float32", random_seed=0, stream_interval=1)
    sched_thread = threading.current_thread()
    spent = {"sched_s": 0.0, "sched_calls": 0, "other_s": 0.0, "other_calls": 0}
    decode = eng.tokenizer.decode

    def timed_decode(*a, **kw):
        t = time.perf_counter()
        try:
            return decode(*a, **kw)
        finally:
            dt = time.perf_counter() - t
            key = "sched" if threading.current_thread() is sched_thread else "other"
            spent[key + "_s"] += dt
            spent[key + "_calls"] += 1

    eng.tokenizer.decode = timed_decode
    g = torch.Generator().manual_seed(0)
    prompts = [[2] + torch.randint(3, 500, (15,), generator=g).tolist() for _ in range(num_requests)]
    rids = [f"r{i}" for i in range(num_requests)]
    base = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    eng.generate(input_ids=[2, 5, 6, 7], sampling_params={"max_new_tokens": 2})  # warm-up
    results = {}
    for scenario in ("stream", "stop"):
        eng.flush_cache()
        for k in spent:
            spent[k] = 0 if k.endswith("calls") else 0.0
        t0 = time.perf_counter()
        if scenario == "stream":
            finals = {}
            for out in eng.generate(input_ids=prompts, sampling_params=base, stream=True, rid=rids):
                if out["meta_info"]["finish_reason"] is not None:
                    finals[out["meta_info"]["id"]] = out
            outs = [finals[r] for r in rids]
        else:
            outs = eng.generate(input_ids=prompts, sampling_params={**base, "stop": NEVER_STOPS}, rid=rids)
        wall = time.perf_counter() - t0
        assert all(len(o["output_ids"]) == output_len for o in outs)
        digest = hashlib.sha256("\x00".join(o["text"] for o in outs).encode("utf-8")).hexdigest()
        results[scenario] = dict(spent, wall_s=wall, text_sha256=digest)
    eng.shutdown()
    return results


def export(rev: str, dest: str) -> None:
    archive = subprocess.run(["git", "-C", HERE, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=None, help="git revision to compare with (default: merge base with main)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.num_requests, args.output_len)))
        return 0
    rev = args.before or subprocess.run(["git", "-C", HERE, "merge-base", "HEAD", "main"], check=True,
                                        capture_output=True, text=True).stdout.strip()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench-detok-") as tmp:
        export(rev, tmp)
        roots = {"before": tmp, "after": HERE}
        for r in range(args.rounds):
            for name in ("before", "after"):
                cmd = [sys.executable, os.path.abspath(__file__), "--child", roots[name],
                       "--num-requests", str(args.num_requests), "--output-len", str(args.output_len)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    print(f"\n{args.num_requests} requests x {args.output_len} output tokens; before = {rev[:12]}, after = this tree; "
          f"medians of {args.rounds} rounds\n")
    print("| scenario | tree | scheduler-thread decode (s) | decode calls on it | other-thread decode (s) | wall (s) |")
    print("|---|---|---|---|---|---|")
    ok = True
    for scenario in ("stream", "stop"):
        for name in ("before", "after"):
            rs = [x[scenario] for x in runs[name]]
            med = {k: statistics.median(x[k] for x in rs) for k in ("sched_s", "sched_calls", "other_s", "wall_s")}
            print(f"| {scenario} | {name} | {med['sched_s']:.3f} | {med['sched_calls']:.0f} | {med['other_s']:.3f} | "
                  f"{med['wall_s']:.1f} |")
        shas = {x[scenario]["text_sha256"] for name in runs for x in runs[name]}
        if len(shas) != 1:
            ok = False
            print(f"FAIL: {scenario}: final texts differ between the trees ({len(shas)} distinct digests)")
    print("\nfinal texts identical before and after: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
