"""YOCO fast prefill (``--kv-sharing-fast-prefill``) on vs off, in one process (not a test).

Two engines on the same E2B-shaped tiny checkpoint with the triton backend, one
with the flag and one without, radix cache off, same prompts. For each prompt
length:

* prefill time: one request, ``max_new_tokens=1``, wall time of ``generate``;
  each repetition runs off and on back to back (order alternating); the speedup
  is the median over ``--reps`` (``--short-reps`` for short prompts) of the
  per-repetition ratios, since this shared machine's speed drifts;
* layer-group times from timing wrappers put on the model instance
  (``model.self_decoder`` / ``model.cross_decoder``) in the same runs, giving the
  **measured bound** = off time / (off time - off cross-decoder time): the speedup
  if the shared layers cost nothing;
* the **FLOP bound** from the config: all layers' prefill FLOPs over the
  self-decoder's on every row plus the shared layers' on the selected row
  (linear layers, attention scores/values under causal and window masks, PLE;
  the LM head on the selected row in both);
* a short generation (``--gen-requests`` requests x ``--gen-tokens`` new tokens
  at once): output tok/s, median TTFT, median TPOT.

Seed 000's chat (1k/1k) and summarisation (8k/1k) scenarios, scaled to this
machine, are the generation rows at ``--chat`` and ``--summ`` prompt lengths.
Accuracy: greedy outputs with the flag on must equal those with it off; the max
|logprob difference| over every compared token is printed.

Usage: ``python -m bench.bench_yoco [--lengths 128,256,512,1024] [--write-docs]``
(``make bench-yoco``). ``--write-docs`` rewrites the "## YOCO fast prefill on
the tiny e2b checkpoint" section of docs/benchmarks.md (``--section`` names another); the plot goes to
docs/yoco_speedup.png.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from bench.docs_section import BENCHMARKS_MD, replace_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SECTION = "## YOCO fast prefill on the tiny e2b checkpoint"
PLOT = os.path.join(ROOT, "docs", "yoco_speedup.png")


# ------------------------------------------------------------------ FLOP model


def _visible_keys(t: int, window: int | None) -> int:
    """Sum over query positions 0..t-1 of the keys each sees (causal, optional window W)."""
    if window is None or window >= t:
        return t * (t + 1) // 2
    return window * (window + 1) // 2 + (t - window) * window


def layer_flops(cfg, i: int, rows: int, visible: int) -> dict[str, int]:
    """FLOPs (2 per multiply-add) of layer i on ``rows`` query rows that see ``visible`` keys in total.

    Counts the linear layers (q/o on every layer; k/v only on layers that own KV,
    no v_proj on k_eq_v full layers), the dense MLP (double-wide on KV-shared
    layers when the config says so), the PLE gate and projection, and attention
    QK^T + PV. Norms, RoPE and activations (O(hidden) per row) are left out.
    """
    hid, heads = cfg.hidden_size, cfg.num_attention_heads
    d = cfg.layer_head_dims[i]
    shared = cfg.is_kv_shared(i)
    kv_heads = cfg.layer_num_kv_heads[cfg.kv_producer[i]]
    qo = 2 * (2 * hid * heads * d)
    kv = 0
    if not shared:
        kv = 2 * hid * kv_heads * d * (1 if cfg.attention_k_eq_v and not cfg.is_sliding(i) else 2)
    inter = cfg.intermediate_size * (2 if cfg.use_double_wide_mlp and shared else 1)
    mlp = 3 * 2 * hid * inter
    p = cfg.hidden_size_per_layer_input
    ple = 2 * (2 * hid * p) if p else 0
    attn = 2 * 2 * heads * d * visible  # scores and values, every query head
    return {"linear": rows * (qo + kv + mlp + ple), "attention": attn, "qkv": rows * (qo // 2 + kv)}


def prefill_flops(cfg, t: int, fast: bool) -> float:
    """FLOPs of one t-token prompt (no cached prefix) prefilled with fast prefill on or off."""
    if cfg.enable_moe_block:
        raise ValueError("the FLOP model counts dense MLPs only; pick a checkpoint without MoE (e2b, e2b_bench)")
    total = 0
    # the last self-decoder layer with the flag: q/k/v projections on every row (K/V are written for all), the
    # rest on the selected row (impl/model/yoco.py)
    cut = cfg.first_kv_shared_layer - 1 if fast and cfg.first_kv_shared_layer < cfg.num_hidden_layers else -1
    for i in range(cfg.num_hidden_layers):
        window = cfg.sliding_window if cfg.is_sliding(i) else None
        if fast and cfg.is_kv_shared(i):
            f = layer_flops(cfg, i, 1, min(t, window) if window else t)  # the last row over its context
        elif i == cut:
            f = layer_flops(cfg, i, 1, min(t, window) if window else t)
            f["linear"] += layer_flops(cfg, i, t, 0)["qkv"] - f["qkv"]
        else:
            f = layer_flops(cfg, i, t, _visible_keys(t, window))
        total += f["linear"] + f["attention"]
    p = cfg.hidden_size_per_layer_input
    total += t * 2 * cfg.hidden_size * cfg.num_hidden_layers * p  # per_layer_model_projection, every row, both modes
    total += 2 * cfg.hidden_size * cfg.vocab_size  # LM head on the one sampled row, both modes
    return float(total)


def flop_bound(cfg, t: int) -> float:
    return prefill_flops(cfg, t, fast=False) / prefill_flops(cfg, t, fast=True)


# ------------------------------------------------------------------ timing


@dataclass
class GroupTimer:
    """Seconds spent in model.self_decoder / model.cross_decoder / the attention backend since the last reset."""

    self_s: float = 0.0
    cross_s: float = 0.0
    attn_s: float = 0.0  # inside the backend's forward (KV write + attention kernel), both groups
    cross_rows: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.self_s, self.cross_s, self.attn_s, self.cross_rows = 0.0, 0.0, 0.0, []

    def install(self, model, backends) -> None:
        """Wrap the layer-group methods and the backends' forward on these instances (classes untouched)."""
        inner_self, inner_cross = model.self_decoder, model.cross_decoder

        # *args: the methods' signatures are the model's business (h [rows, hidden] comes first)
        def self_decoder(h, *args, **kwargs):
            t0 = time.perf_counter()
            out = inner_self(h, *args, **kwargs)
            self.self_s += time.perf_counter() - t0
            return out

        def cross_decoder(h, *args, **kwargs):
            t0 = time.perf_counter()
            out = inner_cross(h, *args, **kwargs)
            self.cross_s += time.perf_counter() - t0
            self.cross_rows.append(int(h.shape[0]))
            return out

        model.self_decoder = self_decoder
        model.cross_decoder = cross_decoder
        for backend in {id(b): b for b in backends}.values():
            inner_attn = backend.forward

            def forward(*args, _inner=inner_attn, **kwargs):
                t0 = time.perf_counter()
                out = _inner(*args, **kwargs)
                self.attn_s += time.perf_counter() - t0
                return out

            backend.forward = forward


@dataclass
class Side:
    """One engine (flag on or off) and what was measured on it."""

    flag: bool
    engine: object
    timer: GroupTimer


def make_prompt(gen: torch.Generator, n: int) -> list[int]:
    return [2] + torch.randint(3, 500, (n - 1,), generator=gen).tolist()  # BOS + random ids in the tokenizer range


def _logprobs(out: dict) -> list[float]:
    return [lp for lp, _, _ in out["meta_info"].get("output_token_logprobs", [])]


class Accuracy:
    """Greedy outputs and output logprobs of flag on vs off, over every comparison of the run."""

    def __init__(self):
        self.compared = 0
        self.mismatches: list[str] = []
        self.max_lp_diff = 0.0

    def compare(self, label: str, off: list[dict], on: list[dict]) -> None:
        for k, (a, b) in enumerate(zip(off, on)):
            self.compared += 1
            if a["output_ids"] != b["output_ids"]:
                self.mismatches.append(f"{label} request {k}: off {a['output_ids']} on {b['output_ids']}")
            for x, y in zip(_logprobs(a), _logprobs(b)):
                self.max_lp_diff = max(self.max_lp_diff, abs(x - y))


def prefill_once(side: Side, prompt: list[int]) -> dict:
    side.timer.reset()
    eng = side.engine
    eng.reset_work_counters()
    t0 = time.perf_counter()
    out = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0.0}, return_logprob=True)
    wall = time.perf_counter() - t0
    work = eng.work_counters()
    # (a prompt longer than the chunked-prefill size runs as several extend forwards, each on the fast path)
    if side.flag and (work["fast_prefill_forwards"] < 1 or work["fast_prefill_forwards"] != work["extend_forwards"]):
        raise RuntimeError(f"flag on but the prefill did not take the fast path: work counters {work}")
    return dict(
        wall=wall,
        self=side.timer.self_s,
        cross=side.timer.cross_s,
        attn=side.timer.attn_s,
        cross_rows=sum(side.timer.cross_rows),
        out=out,
    )


def measure_prefill(sides: dict[bool, Side], n: int, reps: int, gen, acc: Accuracy) -> dict:
    prompt = make_prompt(gen, n)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(reps):
        order = (False, True) if r % 2 == 0 else (True, False)  # alternate who goes first
        for flag in order:
            runs[flag].append(prefill_once(sides[flag], prompt))
    acc.compare(f"prefill {n}", [runs[False][0]["out"]], [runs[True][0]["out"]])
    # Per flag, the run with the median wall time and its own breakdown (parts add up to its wall time).
    med = {flag: sorted(runs[flag], key=lambda x: x["wall"])[(len(runs[flag]) - 1) // 2] for flag in runs}
    off, on = med[False], med[True]
    return dict(
        n=n,
        reps=reps,
        off=off,
        on=on,
        rows_off=off["cross_rows"],
        rows_on=on["cross_rows"],
        # per-pair ratio (the on and off run of one repetition ran back to back), median over repetitions:
        # this machine's speed drifts between repetitions, and a pair sees nearly the same speed
        speedup=statistics.median(a["wall"] / b["wall"] for a, b in zip(runs[False], runs[True])),
        # each off run's own bound (its wall over its wall minus its cross-decoder time), median over the runs
        measured_bound=statistics.median(x["wall"] / (x["wall"] - x["cross"]) for x in runs[False]),
        all_off=[x["wall"] for x in runs[False]],
        all_on=[x["wall"] for x in runs[True]],
    )


def measure_generation(sides: dict[bool, Side], n: int, requests: int, new_tokens: int, gen, acc: Accuracy, order) -> dict:
    prompts = [make_prompt(gen, n) for _ in range(requests)]
    res = {}
    outs = {}
    for flag in order:
        eng = sides[flag].engine
        sp = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
        t0 = time.perf_counter()
        o = eng.generate(input_ids=prompts, sampling_params=sp, return_logprob=True)
        wall = time.perf_counter() - t0
        toks = sum(len(x["output_ids"]) for x in o)
        ttft = [x["meta_info"]["ttft"] for x in o]
        tpot = [(x["meta_info"]["e2e_latency"] - x["meta_info"]["ttft"]) / max(len(x["output_ids"]) - 1, 1) for x in o]
        res[flag] = dict(wall=wall, tok_s=toks / wall, ttft=statistics.median(ttft), tpot=statistics.median(tpot))
        outs[flag] = o
    acc.compare(f"generation {n}", outs[False], outs[True])
    return dict(n=n, requests=requests, new_tokens=new_tokens, off=res[False], on=res[True])


# ------------------------------------------------------------------ report


def kernels_line(engine) -> str:
    """The engine's startup line naming the triton backend's kernel provider."""
    return "; ".join(ln for ln in engine.startup_log if ln.startswith("Attention kernels")) or "no triton backend"


def machine_notes(args, kernels: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    import triton

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (
        f"{cpu}, {os.cpu_count()} CPU cores (shared with other jobs; load average {load[0]:.1f} at the end), "
        f"no GPU; torch {torch.__version__} with {args.threads} intra-op thread(s), triton {triton.__version__}; "
        f"{kernels}; float32"
    )


def prefill_table(rows: list[dict]) -> list[str]:
    out = [
        "| prompt | runs | off (s) | on (s) | speedup | measured bound | speedup / measured bound | FLOP bound "
        "| off: self / cross / rest (s) | on: self / cross / rest (s) | self-decoder share of on | "
        "attention kernels, share of off | cross rows off / on |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for r in rows:
        off, on = r["off"], r["on"]
        parts = lambda m: f"{m['self']:.2f} / {m['cross']:.2f} / {m['wall'] - m['self'] - m['cross']:.2f}"  # noqa: E731
        out.append(
            f"| {r['n']} | {r['reps']} | {off['wall']:.2f} | {on['wall']:.2f} | {r['speedup']:.2f}x "
            f"| {r['measured_bound']:.2f}x | {100 * r['speedup'] / r['measured_bound']:.0f}% | {r['flop_bound']:.2f}x "
            f"| {parts(off)} | {parts(on)} | {100 * on['self'] / on['wall']:.0f}% | {100 * off['attn'] / off['wall']:.0f}% "
            f"| {r['rows_off']} / {r['rows_on']} |"
        )
    return out


def generation_table(rows: list[dict], names: dict[int, str]) -> list[str]:
    out = [
        "| scenario | requests x prompt / new | tok/s off | tok/s on | ratio | median TTFT off / on (s) "
        "| median TPOT off / on (ms) |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for g in rows:
        off, on = g["off"], g["on"]
        out.append(
            f"| {names.get(g['n'], '-')} | {g['requests']} x {g['n']} / {g['new_tokens']} | {off['tok_s']:.2f} "
            f"| {on['tok_s']:.2f} | {on['tok_s'] / off['tok_s']:.2f}x | {off['ttft']:.2f} / {on['ttft']:.2f} "
            f"| {1000 * off['tpot']:.0f} / {1000 * on['tpot']:.0f} |"
        )
    return out


def plot(rows: list[dict], path: str, model: str, kernels: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(n, [r["speedup"] for r in rows], "o-", label="measured speedup (off / on)")
    ax.plot(n, [r["measured_bound"] for r in rows], "s--", label="measured bound (cross-decoder free)")
    ax.plot(n, [0.85 * r["flop_bound"] for r in rows], ":", color="grey", label="85% of FLOP bound")
    ax.plot(n, [r["flop_bound"] for r in rows], "^-.", label="FLOP bound (config)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n)
    ax.set_xticklabels([str(x) for x in n])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill speedup, flag on vs off")
    ax.set_title(f"YOCO fast prefill, '{model}' checkpoint, triton backend ({kernels})")
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=1.0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def conclusion(rows: list[dict], cfg) -> str:
    last = rows[-1]
    off, on = last["off"], last["on"]
    of_flop = last["speedup"] / last["flop_bound"]
    of_measured = last["speedup"] / last["measured_bound"]
    rest_off = off["wall"] - off["self"] - off["cross"]
    rest_on = on["wall"] - on["self"] - on["cross"]
    s = cfg.num_hidden_layers - cfg.first_kv_shared_layer
    ideal = off["wall"] - off["cross"]  # the flag-on time if the shared layers cost nothing
    below = last["measured_bound"] < last["flop_bound"]
    return (
        f"**Acceptance.** At the longest prompt ({last['n']} tokens) the measured prefill speedup is "
        f"{last['speedup']:.2f}x: {100 * of_flop:.0f}% of the FLOP bound ({last['flop_bound']:.2f}x) and "
        f"{100 * of_measured:.0f}% of the measured bound ({last['measured_bound']:.2f}x); the target is 85% "
        f"({'met' if of_flop >= 0.85 else 'missed'} against the FLOP bound, "
        f"{'met' if of_measured >= 0.85 else 'missed'} against the measured one). The measured bound is the "
        f"flag-off time with its cross-decoder time removed ({ideal:.2f} s); the flag-on run took "
        f"{on['wall'] - ideal:+.2f} s more than that: the cross-decoder on {last['rows_on']} row(s) ({on['cross']:.2f} s: "
        f"{s} layers of projections, MLP and PLE on those rows and one attention launch each over the whole "
        f"context), the work outside both layer groups ({rest_on:.2f} s on vs {rest_off:.2f} s off) and noise: the "
        f"self-decoder does the same work in both modes but took {off['self']:.2f} s off and {on['self']:.2f} s on "
        f"(this 2-core machine is shared with other jobs: the {last['n']}-token off runs took "
        f"{', '.join(f'{x:.1f}' for x in last['all_off'])} s, hence back-to-back pairs and medians).\n\n"
        f"**Measured bound vs FLOP bound.** The measured bound ({last['measured_bound']:.2f}x) is "
        f"{'below' if below else 'above'} the FLOP bound ({last['flop_bound']:.2f}x): the FLOP bound weighs the "
        "layer groups by arithmetic, the measured bound by their time on this machine, where matmul efficiency "
        "differs between shapes (the shared layers' double-wide MLPs run larger gemms) and the attention kernels "
        f"took {100 * off['attn'] / off['wall']:.0f}% of the flag-off prefill."
    )


def render_section(args, notes: str, cmd: str, rows, gens, names, acc: Accuracy, cfg, elapsed: float) -> str:
    lines = [
        args.section,
        "",
        "Flag `--kv-sharing-fast-prefill` on vs off, same process, same prompts, radix cache off, greedy. "
        f"Checkpoint: `{args.model}` ({cfg.num_hidden_layers} layers, {cfg.num_kv_shared_layers} KV-shared, "
        f"hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV head, head_dim "
        f"{cfg.head_dim}/{cfg.global_head_dim}, window {cfg.sliding_window}, PLE {cfg.hidden_size_per_layer_input}), "
        f"attention backend: flag off `{args.off_backend}`, flag on `triton`.",
        "",
        f"Command (repo root): `{cmd}` (`make bench-yoco` runs it without `--write-docs`; wall time of the whole run: "
        f"{elapsed / 60:.1f} min).",
        "",
        f"Machine: {notes}.",
        "",
        "### Prefill (one request, 1 new token; alternating on/off runs, the median run per flag)",
        "",
        "*measured bound* = off time / (off time - time in `cross_decoder` during the off runs), from timing "
        "wrappers on the model's `self_decoder` / `cross_decoder` in the same runs: the speedup if the shared "
        "layers cost nothing. *FLOP bound* = prefill FLOPs with the flag off / with it on, from the config "
        "(q/k/v/o projections per layer type, MLP double-wide on shared layers, PLE gate/projection, attention "
        "scores and values under causal and window masks; LM head on the one sampled row in both). *speedup* = median "
        "over repetitions of off time / on time of the two back-to-back runs of one repetition. *rest* = "
        "time outside both layer groups; *attention kernels* = time inside the attention backend (KV write + "
        "triton kernel) in the median off run; *self-decoder share of on* = the flag-on run's self-decoder time over "
        "its wall time (the speedup / bound ratio it implies, free of run-to-run noise). Each row shows the median run's own breakdown; the measured bound "
        "is the median of the off runs' own bounds.",
        "",
        *prefill_table(rows),
        "",
        f"![speedup vs prompt length]({os.path.basename(args.plot)})",
        "",
        conclusion(rows, cfg),
        "",
        f"### Generation ({args.gen_requests} requests at once, {args.gen_tokens} new tokens each, one run per flag)",
        "",
        "Seed 000's scenarios scaled to this machine: chat 1k/1k -> "
        f"{args.chat} prompt / {args.gen_tokens} new tokens, summarisation 8k/1k -> {args.summ} / {args.gen_tokens}. "
        "TTFT is measured from submission (all requests arrive at once); TPOT = (latency - TTFT) / (tokens - 1).",
        "",
        *generation_table(gens, names),
        "",
        f"Accuracy: {acc.compared} request(s) compared flag on vs off; greedy outputs "
        + ("identical in every one" if not acc.mismatches else f"DIFFER in {len(acc.mismatches)}: {acc.mismatches[:3]}")
        + f"; max |output logprob difference| {acc.max_lp_diff:.2e} (logprob parity stands in for MMLU on random "
        "weights).",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="e2b", help="tiny checkpoint name (impl.checkpoint_factory.checkpoints) or a folder")
    ap.add_argument("--lengths", default="128,256,512,1024", help="comma-separated prompt lengths for the prefill sweep")
    ap.add_argument("--reps", type=int, default=3, help="prefill runs per flag and length (median)")
    ap.add_argument("--short-reps", type=int, default=5, help="prefill runs per flag for lengths <= --short-max")
    ap.add_argument("--short-max", type=int, default=256, help="short prompts are cheap: more runs against noise")
    ap.add_argument("--gen-requests", type=int, default=4)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--gen-lengths", default=None, help="prompt lengths of the generation runs (default: --lengths)")
    ap.add_argument("--chat", type=int, default=256, help="prompt length standing in for chat 1k/1k")
    ap.add_argument("--summ", type=int, default=1024, help="prompt length standing in for summarisation 8k/1k")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both engines)")
    ap.add_argument("--off-backend", default="triton", choices=["triton", "torch_native"],
                    help="attention backend of the flag-off engine: triton (the flag is the only difference) or "
                    "torch_native (what `make serve` runs on CPU without the flag)")
    ap.add_argument("--section", default=SECTION, help="docs/benchmarks.md section --write-docs replaces")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=PLOT)
    ap.add_argument("--write-docs", action="store_true", help=f"rewrite the '{SECTION}' section of docs/benchmarks.md")
    args = ap.parse_args(argv)
    try:
        lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
        gen_lengths = sorted({int(x) for x in (args.gen_lengths or args.lengths).split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--lengths / --gen-lengths must be comma-separated integers, got {args.lengths!r}")
    if not lengths or min(lengths) < 2 or args.reps < 1:
        raise SystemExit("need at least one prompt length >= 2 and --reps >= 1")
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)

    from impl import Engine
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    longest = max(lengths + gen_lengths)
    capacity = max(longest * args.gen_requests, longest) + args.gen_requests * (args.gen_tokens + 8) + 64
    sides: dict[bool, Side] = {}
    for flag in (False, True):
        eng = Engine(
            model_path=path, attention_backend="triton" if flag else args.off_backend, kv_sharing_fast_prefill=flag,
            disable_radix_cache=True,
            dtype="float32", random_seed=0, max_total_tokens=capacity,
        )
        timer = GroupTimer()
        timer.install(eng.runner.model, (eng.runner.prefill_backend, eng.runner.decode_backend))
        sides[flag] = Side(flag, eng, timer)
    cfg = sides[False].engine.model_config
    if cfg.num_kv_shared_layers == 0:
        raise SystemExit(f"{args.model} has no KV-shared layers: fast prefill does not apply")
    print(
        f"model {args.model} ({cfg.num_hidden_layers} layers, {cfg.num_kv_shared_layers} KV-shared, hidden "
        f"{cfg.hidden_size}); off: {args.off_backend} backend, on: triton backend; "
        f"{kernels_line(sides[True].engine)}; {args.threads} thread(s); lengths {lengths}; "
        f"reps {args.reps}",
        flush=True,
    )
    gen = torch.Generator().manual_seed(args.seed)
    warm = make_prompt(gen, min(128, min(lengths)))
    for flag in (False, True):  # warm-up: allocator, interpreter caches, first-call imports
        prefill_once(sides[flag], warm)

    acc = Accuracy()
    rows = []
    for n in lengths:
        r = measure_prefill(sides, n, max(args.reps, args.short_reps) if n <= args.short_max else args.reps, gen, acc)
        r["flop_bound"] = flop_bound(cfg, n)
        rows.append(r)
        print(
            f"prefill {n:5d}: off {r['off']['wall']:.3f}s (cross {r['off']['cross']:.3f}s) on {r['on']['wall']:.3f}s "
            f"(cross {r['on']['cross']:.3f}s) speedup {r['speedup']:.2f}x measured bound {r['measured_bound']:.2f}x "
            f"FLOP bound {r['flop_bound']:.2f}x  [runs off {[round(x, 2) for x in r['all_off']]} "
            f"on {[round(x, 2) for x in r['all_on']]}]",
            flush=True,
        )
    gens = []
    for k, n in enumerate(gen_lengths):
        g = measure_generation(
            sides, n, args.gen_requests, args.gen_tokens, gen, acc, (False, True) if k % 2 == 0 else (True, False)
        )
        gens.append(g)
        print(
            f"generation {args.gen_requests} x {n}/{args.gen_tokens}: tok/s off {g['off']['tok_s']:.2f} on "
            f"{g['on']['tok_s']:.2f}; TTFT {g['off']['ttft']:.2f}s / {g['on']['ttft']:.2f}s; TPOT "
            f"{1000 * g['off']['tpot']:.0f} / {1000 * g['on']['tpot']:.0f} ms",
            flush=True,
        )
    for side in sides.values():
        side.engine.shutdown()

    names = {args.chat: "chat 1k/1k (scaled)", args.summ: "summarisation 8k/1k (scaled)"}
    if args.chat == args.summ:
        names = {args.chat: "chat + summarisation (scaled)"}
    elapsed = time.perf_counter() - t_start
    notes = machine_notes(args, kernels_line(sides[True].engine))
    extra = shlex.join(sys.argv[1:] if argv is None else argv)
    cmd = ".venv/bin/python -m bench.bench_yoco" + (f" {extra}" if extra else "")
    section = render_section(args, notes, cmd, rows, gens, names, acc, cfg, elapsed)
    print()
    print(section)
    plot(rows, args.plot, args.model, sides[True].engine.attention_kernels["prefill"]["provider"] + " kernels")
    print(f"plot written to {os.path.relpath(args.plot, ROOT)}")
    if args.write_docs:
        replace_section(section)
        print(f"section '{args.section}' written to {os.path.relpath(BENCHMARKS_MD, ROOT)}")
    return 1 if acc.mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
