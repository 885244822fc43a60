"""Engine vs transformers ``generate`` on one workload, in one run (not a test).

Workload: N requests with prompt lengths uniform in [min_prompt, max_prompt]
and output lengths uniform in [min_output, max_output] (seeded), greedy, EOS
ignored so every system produces exactly the requested tokens. All requests
arrive at t=0 (an offline batch); TTFT is measured from there.

Systems (same checkpoint, float32, same torch thread count):
* ``impl.Engine``: continuous batching, chunked prefill, radix cache on.
* transformers, one request at a time (``generate`` per request, in order).
* transformers, one padded batch (left padding, one ``generate`` call that runs
  every row to the longest requested output; only requested tokens count).

Prints output tok/s, median TTFT and median TPOT per system and our ratio to each
(with ``--repeat N``, N alternating rounds; each system's fastest run), and for each engine run
the time spent in extend (prefill) and decode forwards.
Usage: ``python -m bench.bench_engine [--num-requests 32 ...]`` (``make bench-engine``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time


import torch


def workload(args) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(args.seed)
    out = []
    for _ in range(args.num_requests):
        n = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=g))
        m = int(torch.randint(args.min_output, args.max_output + 1, (1,), generator=g))
        out.append(([2] + torch.randint(3, 500, (n - 1,), generator=g).tolist(), m))
    return out


def summarize(name: str, wall: float, out_tokens: int, ttfts: list[float], tpots: list[float]) -> dict:
    return dict(name=name, wall=wall, tok_s=out_tokens / wall, ttft=statistics.median(ttfts), tpot=statistics.median(tpots))


def run_engine(path: str, reqs, args, backend: str | None = None, fast_prefill: bool = False) -> dict:
    from impl import Engine

    kw = {"kv_sharing_fast_prefill": True} if fast_prefill else {}
    if args.chunked_prefill_size is not None:
        kw["chunked_prefill_size"] = args.chunked_prefill_size
    if backend is not None:
        kw["attention_backend"] = backend
    eng = Engine(path, dtype="float32", random_seed=0, **kw)
    said = getattr(run_engine, "said", set())
    if (backend, fast_prefill) not in said:
        run_engine.said = said | {(backend, fast_prefill)}
        print("  engine: " + "; ".join(ln for ln in eng.startup_log
                                        if ln.startswith(("CPU kernels", "Attention backends", "Attention kernels"))))
    eng.generate(input_ids=[2, 5, 6, 7], sampling_params={"max_new_tokens": 2})  # warm-up
    eng.flush_cache()
    # forwards, wall seconds and process CPU seconds inside ModelRunner.forward (CPU seconds: the work,
    # steadier than wall time on a loaded host; with --threads 1 there is no thread pool spinning in them)
    phases = {"extend": [0, 0.0, 0.0], "decode": [0, 0.0, 0.0]}
    forward = eng.runner.forward

    def timed_forward(fb):
        t, c = time.perf_counter(), time.process_time()
        out = forward(fb)
        p = phases["decode" if fb.forward_mode.is_decode else "extend"]
        p[0] += 1
        p[1] += time.perf_counter() - t
        p[2] += time.process_time() - c
        return out

    eng.runner.forward = timed_forward
    t0, c0 = time.perf_counter(), time.process_time()
    outs = eng.generate(
        input_ids=[p for p, _ in reqs],
        sampling_params=[{"temperature": 0.0, "max_new_tokens": m, "ignore_eos": True} for _, m in reqs],
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ext, dec = phases["extend"], phases["decode"]
    print(
        f"  engine forwards{' (fast prefill)' if fast_prefill else ''}: extend {ext[1]:.2f} s ({ext[0]} passes, "
        f"{ext[2]:.2f} CPU s), decode {dec[1]:.2f} s ({dec[0]} steps, {dec[2]:.2f} CPU s = "
        f"{1000 * dec[2] / max(dec[0], 1):.1f} ms a step), rest {wall - ext[1] - dec[1]:.2f} s; process CPU {cpu:.2f} s",
        flush=True,
    )
    ttfts = [o["meta_info"]["ttft"] for o in outs]
    tpots = [(o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"]) / max(len(o["output_ids"]) - 1, 1) for o in outs]
    eng.shutdown()
    label = "impl.Engine (continuous batching)" if backend is None else f"impl.Engine, --attention-backend {backend}"
    label += ", --kv-sharing-fast-prefill" if fast_prefill else ""
    return summarize(label, wall, sum(len(o["output_ids"]) for o in outs), ttfts, tpots)


class _FirstTokenTimer:
    """A transformers streamer that records when the first generated token appears."""

    def __init__(self):
        self.calls = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # the first put is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _hf(path: str):
    from transformers import Gemma4ForCausalLM

    return Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def run_hf_sequential(path: str, reqs, args) -> dict:
    model = _hf(path)
    gen = dict(do_sample=False, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        model.generate(torch.tensor([[2, 5, 6, 7]]), max_new_tokens=2, **gen)  # warm-up
        t0 = time.perf_counter()
        ttfts, tpots, total = [], [], 0
        for prompt, m in reqs:
            timer = _FirstTokenTimer()
            out = model.generate(torch.tensor([prompt]), max_new_tokens=m, streamer=timer, **gen)
            end = time.perf_counter()
            n = out.shape[1] - len(prompt)
            total += n
            ttfts.append(timer.first - t0)
            tpots.append((end - timer.first) / max(n - 1, 1))
    return summarize("transformers generate, one request at a time", time.perf_counter() - t0, total, ttfts, tpots)


def run_hf_padded(path: str, reqs, args) -> dict:
    model = _hf(path)
    longest = max(len(p) for p, _ in reqs)
    ids = torch.zeros((len(reqs), longest), dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(reqs):
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    max_new = max(m for _, m in reqs)
    gen = dict(do_sample=False, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2, -8:], attention_mask=mask[:2, -8:], max_new_tokens=2, **gen)  # warm-up
        timer = _FirstTokenTimer()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=max_new, streamer=timer, **gen)
        wall = time.perf_counter() - t0
    useful = sum(m for _, m in reqs)  # tokens past a request's own length are discarded
    ttft = timer.first - t0
    tpot = (wall - ttft) / max(max_new - 1, 1)
    return summarize("transformers generate, one padded batch", wall, useful, [ttft], [tpot])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="e2b", help="tiny checkpoint name (impl.checkpoint_factory.checkpoints) or a folder")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--min-prompt", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--min-output", type=int, default=64)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for every system")
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-sequential", action="store_true", help="skip transformers one-request-at-a-time")
    ap.add_argument("--repeat", type=int, default=1, help="run each system N times, keep its fastest run (noisy hosts)")
    ap.add_argument("--attention-backends", default="",
                    help="comma-separated backends to run our engine with, one row each (torch_native,triton: the "
                    "triton backend's CPU kernels vs torch_native); default: the engine's default backend")
    ap.add_argument("--fast-prefill", default="off",
                    help="off, on or off,on: run our engine without / with --kv-sharing-fast-prefill (one row each)")
    ap.add_argument("--skip-hf", action="store_true", help="run only our engine (with --attention-backends)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    reqs = workload(args)
    print(
        f"workload: {len(reqs)} requests, prompts {args.min_prompt}-{args.max_prompt} tokens "
        f"(total {sum(len(p) for p, _ in reqs)}), outputs {args.min_output}-{args.max_output} tokens "
        f"(total {sum(m for _, m in reqs)}); model {args.model}; float32; {args.threads} thread(s); "
        f"device cpu ({os.cpu_count()} cores visible)",
        flush=True,
    )
    backends = [b.strip() for b in args.attention_backends.split(",") if b.strip()] or [None]
    fast_names = [f.strip() for f in args.fast_prefill.split(",") if f.strip()]
    if not fast_names or any(f not in ("off", "on") for f in fast_names):
        ap.error(f"--fast-prefill takes off, on or off,on; got {args.fast_prefill!r}")
    fasts = [f == "on" for f in fast_names]
    ours_runners = [functools.partial(run_engine, backend=b, fast_prefill=f) for f in fasts for b in backends]
    hf_runners = [] if args.skip_hf else [run_hf_padded] + ([] if args.skip_sequential else [run_hf_sequential])
    runners = ours_runners + hf_runners
    # Rounds alternate the systems (ours, padded, [sequential], ours, ...) so a burst of load on this
    # shared host hits both rather than one system's runs; each system keeps its fastest run.
    runs: list[list[dict]] = [[] for _ in runners]
    for _ in range(max(1, args.repeat)):
        for i, fn in enumerate(runners):
            runs[i].append(fn(path, reqs, args))
            print(f"  done: {runs[i][-1]['name']} in {runs[i][-1]['wall']:.1f}s", flush=True)
    results = [min(r, key=lambda x: x["wall"]) for r in runs]
    ours = results[0]
    print()
    print("| system | output tok/s | median TTFT (s) | median TPOT (ms) | wall (s) | our tok/s ratio |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ratio = ours["tok_s"] / r["tok_s"]
        print(f"| {r['name']} | {r['tok_s']:.1f} | {r['ttft']:.2f} | {r['tpot'] * 1000:.1f} | {r['wall']:.1f} | {ratio:.2f}x |")
    # Each round's own ratio (the two systems run back to back): the spread the load causes.
    if len(runs) > 1:
        per_round = [o["tok_s"] / p["tok_s"] for o, p in zip(runs[0], runs[1])]
        print()
        print(f"ratio of the first row to '{results[1]['name']}' per round: " + ", ".join(f"{x:.2f}x" for x in per_round))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
