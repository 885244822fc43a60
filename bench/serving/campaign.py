"""Seed 000's serving campaign through HTTP (``make bench-serving``): one server configuration at a time.

Configurations on the ``e2b_bench`` checkpoint (E2B structure, hidden 256), prefill on the
triton backend: fast prefill off, on, MTP, MTP + fast prefill (the seed's campaign runs
triton + MTP). Each is launched as ``python -m impl.launch_server`` on a free port; a
configuration the server refuses at launch is reported as refused with its message.
Each running server gets both scenarios (``chat``, ``summ`` at ``--scale``; 80 prompts,
warmup 2, seed 1, all requests at once) through the load generator's native ``/generate``
backend, then is stopped.

Writes one JSON line per run (``--output-file``) and, with ``--write-docs``, the
"## Serving benchmark" section of docs/benchmarks.md and docs/bench_serving.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.docs_section import BENCHMARKS_MD, replace_section

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "docs", "bench_serving.png")
SECTION = "## Serving benchmark"
FLAG = "--kv-sharing-fast-prefill"


@dataclass
class Config:
    name: str
    flags: list[str]
    refused: str | None = None
    kernels: str = ""  # the server's attention kernels, from /get_server_info
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # scenario -> metrics json


def draft_model() -> str:
    """An MTP assistant checkpoint for e2b_bench when one exists, else the e2b one (the server decides)."""
    from impl.checkpoint_factory import checkpoints as ck

    for name, target in getattr(ck, "ASSISTANT_TARGETS", {}).items():
        if target == "e2b_bench":
            return ck.tiny_checkpoint(name)
    return ck.tiny_checkpoint("assistant")


def configs(decode_backend: str) -> list[Config]:
    base = ["--attention-backend", "triton", "--decode-attention-backend", decode_backend]
    mtp = ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", draft_model()]
    return [Config("off", base), Config("on", [*base, FLAG]), Config("MTP", [*base, *mtp]),
            Config("MTP + on", [*base, *mtp, FLAG])]


def refusal(log: str) -> str:
    """Why a server did not start: its last ERROR record (with continuation lines), else its log's last line."""
    lines = log.strip().splitlines()
    starts = [i for i, ln in enumerate(lines) if re.match(r"\[[^\]]+\] ERROR ", ln)]
    if not starts:
        return lines[-1][:500] if lines else "exited without output"
    i = starts[-1]
    body = [re.sub(r"^\[[^\]]+\] ERROR [\w.]+: ", "", lines[i])]
    body += [ln for ln in lines[i + 1:] if not ln.startswith("[")]
    return " ".join(" ".join(body).split())[:500]


def run_config(cfg: Config, model: str, scenarios, args) -> None:
    from bench.serving.cli import served_model
    from bench.serving.datasets import random_ids
    from bench.serving.runner import benchmark
    from contracts.adapters import impl_http

    argv = ["--model-path", model, *cfg.flags, "--context-length", str(args.context_length)]
    print(f"\n=== {cfg.name}: python -m impl.launch_server {' '.join(argv)}", flush=True)
    try:
        server = impl_http.start(argv)
    except RuntimeError as e:
        cfg.refused = refusal(str(e))
        print(f"refused: {cfg.refused}", flush=True)
        return
    try:
        info = json.loads(_get(server.url + "/get_model_info"))
        cfg.kernels = kernels_of(json.loads(_get(server.url + "/get_server_info")))
        print(f"attention kernels: {cfg.kernels}", flush=True)
        name = served_model(server.url)
        for sc in scenarios:
            rows = random_ids(sc.num_prompts + sc.warmup_requests, sc.input_len, sc.output_len, sc.range_ratio,
                              int(info["vocab_size"]), sc.seed)
            res = asyncio.run(benchmark(server.url, "sglang", name, rows[sc.warmup_requests:],
                                        warmup_rows=rows[: sc.warmup_requests], seed=sc.seed, label=f"{cfg.name} {sc.label}"))
            m = res.metrics
            print(f"{cfg.name} {sc.label}: {m.output_throughput:.2f} tok/s, median TTFT {m.ttft_ms.median:.0f} ms, "
                  f"median TPOT {m.tpot_ms.median:.1f} ms, {m.completed} ok / {m.failed} failed, {m.duration_s:.1f} s",
                  flush=True)
            cfg.results[sc.name] = m.to_json()
            if args.output_file:
                with open(args.output_file, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"tag": cfg.name, "server_argv": argv, "scenario": sc.name, "scale": args.scale,
                                        "random_input_len": sc.input_len, "random_output_len": sc.output_len,
                                        "num_prompts": sc.num_prompts, "warmup_requests": sc.warmup_requests,
                                        "seed": sc.seed, **m.to_json()}) + "\n")
    finally:
        server.stop()


def kernels_of(server_info: dict[str, Any]) -> str:
    """``prefill: triton (cpu), decode: torch_native`` from ``/get_server_info``'s ``attention_kernels``."""
    parts = []
    for role, k in (server_info.get("attention_kernels") or {}).items():
        provider = f" ({k['provider']})" if k.get("provider") else ""
        parts.append(f"{role}: {k.get('backend')}{provider}")
    return ", ".join(parts) or "not reported"


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=60).text


# ------------------------------------------------------------------ report


def _fmt(v: float | str | None, unit: str) -> str:
    if v is None or isinstance(v, str):
        return v or "not run"
    return f"{v:.2f}" if unit == "tok/s" else f"{v:.0f}" if unit == "ms" and v >= 100 else f"{v:.1f}"


def _gain(a: float | str | None, b: float | str | None, higher_better: bool) -> str:
    if not isinstance(a, float) or not isinstance(b, float) or a == 0 or b == 0:
        return "-"
    g = (b / a - 1) if higher_better else (a / b - 1)
    return f"{g:+.1%}"


METRICS = (("output tok/s", "tok/s", lambda m: m["output_throughput"], True),
           ("median TTFT (ms)", "ms", lambda m: m["ttft_ms"]["median"], False),
           ("median TPOT (ms)", "ms", lambda m: m["tpot_ms"]["median"], False))


def table(cfgs: list[Config], scenarios) -> list[str]:
    by = {c.name: c for c in cfgs}

    def val(c: str, sc: str, f) -> float | str | None:
        cfg = by.get(c)
        if cfg is None or (not cfg.refused and sc not in cfg.results):
            return None
        return "refused" if cfg.refused else float(f(cfg.results[sc]))

    out = ["| scenario | metric | off | on | gain | MTP | MTP + on | gain |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for sc in scenarios:
        for label, unit, f, hb in METRICS:
            v = {c: val(c, sc.name, f) for c in ("off", "on", "MTP", "MTP + on")}
            out.append(f"| {sc.label} | {label} | {_fmt(v['off'], unit)} | {_fmt(v['on'], unit)} | "
                       f"{_gain(v['off'], v['on'], hb)} | {_fmt(v['MTP'], unit)} | {_fmt(v['MTP + on'], unit)} | "
                       f"{_gain(v['MTP'], v['MTP + on'], hb)} |")
        acc = {c: val(c, sc.name, lambda m: m.get("accept_length") or float("nan")) for c in ("MTP", "MTP + on")}
        if any(isinstance(a, float) for a in acc.values()):
            out.append(f"| {sc.label} | accept length (tokens / verify) | - | - | - | {_fmt(acc['MTP'], '')} | "
                       f"{_fmt(acc['MTP + on'], '')} | - |")
    return out


def sglang_command(sc, url: str = "http://127.0.0.1:30000") -> str:
    return (f"python -m sglang.bench_serving --backend sglang --base-url {url} --dataset-name random-ids "
            f"--random-input-len {sc.input_len} --random-output-len {sc.output_len} --random-range-ratio {sc.range_ratio:g} "
            f"--num-prompts {sc.num_prompts} --warmup-requests {sc.warmup_requests} --seed {sc.seed} --request-rate inf")


def plot(cfgs: list[Config], scenarios, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [c for c in cfgs if not c.refused]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (label, _, f, _) in zip(axes, METRICS):
        w = 0.8 / max(1, len(ran))
        for k, c in enumerate(ran):
            xs = [i + k * w for i in range(len(scenarios))]
            ax.bar(xs, [f(c.results[s.name]) if s.name in c.results else 0 for s in scenarios], w, label=c.name)
        ax.set_xticks([i + w * (len(ran) - 1) / 2 for i in range(len(scenarios))], [s.label for s in scenarios])
        ax.set_title(label)
    axes[0].legend()
    refused = [c.name for c in cfgs if c.refused]
    fig.suptitle("Serving benchmark, e2b_bench, triton prefill" + (f" (refused: {', '.join(refused)})" if refused else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def render(cfgs, scenarios, args, cmd: str, elapsed: float, load: str) -> str:
    kernels = sorted({c.kernels for c in cfgs if c.kernels})
    lines = [
        SECTION, "",
        f"Command (repo root): `{cmd}` (`make bench-serving ARGS=...`; wall time of the whole run: {elapsed / 60:.1f} min).", "",
        f"Each configuration is a fresh `python -m impl.launch_server --model-path <e2b_bench> --attention-backend triton "
        f"--decode-attention-backend {args.decode_backend} [flags]`; the load generator (`bench/serving/`, SGLang "
        f"bench_serving's definitions) sends seed 000's scenarios through the native streaming `/generate` route: "
        f"random-ids prompts, {scenarios[0].num_prompts} prompts, warmup {scenarios[0].warmup_requests} (excluded), seed "
        f"{scenarios[0].seed}, all requests at once, greedy, EOS ignored. Scale {args.scale:g} of the seed's lengths "
        f"(chat 1024/1024, summ 8192/1024), chosen so the whole campaign runs in about 20-40 minutes here.", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs (load average {load} at the "
        f"end), no GPU; code at commit {git_commit()}. Attention kernels as the servers reported them (`/get_server_info`): "
        f"{'; '.join(kernels) or 'not reported'}. gain: on vs off (tok/s higher, times lower is better), and "
        "MTP + on vs MTP.", "",
        *table(cfgs, scenarios), "",
        f"![serving benchmark]({os.path.basename(PLOT)})", "",
        "Reading the numbers: all requests arrive at once, so TTFT includes queueing behind earlier prefills, and "
        "later arrivals are prefilled in mixed prefill + decode batches. MTP drafts with `assistant_bench`, an "
        "assistant for this random-weight target: a random target's next tokens are unpredictable, so few drafts "
        "are accepted (accept length row) and the MTP columns show the speculative loop's cost, not its gain "
        "(`make bench-spec` measures MTP on a target with learnable structure).",
    ]
    refused = [c for c in cfgs if c.refused]
    lines += [""] if refused else []
    for c in refused:
        flags = " ".join(os.path.basename(f) if f.startswith("/") else f for f in c.flags)
        reason = re.sub(r"/\S*/checkpoints/", "", c.refused)
        lines.append(f"- {c.name} (`{flags}`): refused at launch: {reason}")
    lines += ["", "The same scenarios with SGLang's own client, against our server (or any SGLang-compatible one):", ""]
    lines += [f"    {sglang_command(sc)}" for sc in scenarios]
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    """The checkout's short commit (``+`` when the work tree has changes), or ``unknown``."""
    import subprocess

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+" if dirty else "")


def main(argv=None) -> int:
    from bench.serving.presets import PRESETS
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    ap = argparse.ArgumentParser(prog="python -m bench.serving.campaign", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1 / 8)
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--scenarios", default="chat,summ")
    ap.add_argument("--configs", default="off,on,MTP,MTP + on", help="comma-separated subset of the four configurations")
    ap.add_argument("--decode-backend", default="torch_native", choices=["torch_native", "triton"])
    ap.add_argument("--context-length", type=int, default=8192 + 1024)
    ap.add_argument("--output-file", default=os.path.join(ROOT, ".cache", "bench_serving.jsonl"))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    scenarios = []
    for name in args.scenarios.split(","):
        if name not in PRESETS:
            ap.error(f"unknown scenario {name!r}; choose from {sorted(PRESETS)}")
        sc = PRESETS[name].scaled(args.scale)
        scenarios.append(type(sc)(sc.name, sc.input_len, sc.output_len, args.num_prompts, sc.warmup_requests, sc.seed,
                                  sc.range_ratio))
    wanted = [s.strip() for s in args.configs.split(",")]
    cfgs = [c for c in configs(args.decode_backend) if c.name in wanted]
    if len(cfgs) != len(wanted):
        ap.error(f"--configs: choose from off, on, MTP, MTP + on; got {wanted}")
    os.makedirs(os.path.dirname(args.output_file), exist_ok=True)
    model = tiny_checkpoint("e2b_bench")
    t0 = time.time()
    for c in cfgs:
        run_config(c, model, scenarios, args)
    elapsed = time.time() - t0
    load = f"{os.getloadavg()[0]:.1f}"
    cmd = "python -m bench.serving.campaign " + " ".join(sys.argv[1:] if argv is None else argv)
    text = render(cfgs, scenarios, args, cmd.strip(), elapsed, load)
    print("\n" + text)
    for sc in scenarios:
        print(f"SGLang's client, same scenario: {sglang_command(sc)}")
    if args.write_docs:
        replace_section(text)
        plot(cfgs, scenarios, PLOT)
        print(f"wrote {BENCHMARKS_MD} and {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
