"""Quantized weights at E2B's full size, end to end: ours in bf16 / int8 / int4 against llama.cpp's bf16 / Q8_0 /
Q4_0 GGUFs of the same checkpoint, one server at a time (``make bench-quant-full``; a benchmark, not a test).

Checkpoint ``e2b-full-wc`` (the published E2B text shape at full size, vocabulary 262,144, bf16, well-conditioned
weights: ``impl/checkpoint_factory/checkpoints.py``) by default: llama.cpp's converter takes its Gemma-style tokenizer, and
its greedy tokens mean something. Figures as ``bench/bench_full.py`` takes them for ours (pp512, pp1024,
tg128 through the server; (a) 4 concurrent 1024-token prompts + 16 new tokens; peak RSS of the process tree) and
as llama.cpp's users take them for llama.cpp (``llama-bench``; ``llama-server`` for (a)): see
``bench/bench_llamacpp.py``.

Phases (each may run under its own lock on a shared machine):

* ``--phase ours``: every ``--formats`` entry x ``--flags``, JSON ``quant-ours-<format>-<flag>.json``;
* ``--phase llamacpp``: build, convert, measure (``bench/bench_llamacpp.py``), JSON ``llamacpp-<quant>.json``;
* ``--phase report``: the table and the acceptance ratios of issue 32 (``--write-docs``: the section in
  ``docs/benchmarks.md`` titled with the CPU kind, so a run on one kind never replaces another's).

The machine's limits are measured before every server (float32 / bf16 GEMM rates at the E2B shapes, our W8A8
kernel's int8 GEMM rate at the same shapes, copy bandwidth); a decode bound is each format's bytes per step
(ours: ``/get_server_info`` ``quantization.decode_weight_bytes``; llama.cpp: the GGUF's tensors but the
per-layer-embedding table) over the copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from bench import bench_llamacpp
from bench.bench_full import measure_limits, model_costs, our_server, run_server, warm_page_cache
from bench.bench_peer import free_port
from bench.docs_section import print_section
from bench.machine import cpu_kind, min_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Quantized weights at E2B's full size, end to end"
FORMATS = {"bf16": "", "int8dq": "--torchao-config int8dq", "int8wo": "--torchao-config int8wo",
           "int4wo-128": "--torchao-config int4wo-128", "8da4w-128": "--torchao-config 8da4w-128",
           "int8dq-shared-8da4w-128": "--torchao-config int8dq --torchao-config-kv-shared 8da4w-128"}
LABEL = {"bf16": "bf16", "int8dq": "int8 W8A8 (`--torchao-config int8dq`)", "int8wo": "int8 W8A16 (`int8wo`)",
         "int4wo-128": "int4 W4A16 (`int4wo-128`)", "8da4w-128": "int4 W4A8 (`8da4w-128`)",
         "int8dq-shared-8da4w-128": "W8A8, the KV-shared layers int4 W4A8 (`int8dq`, `--torchao-config-kv-shared 8da4w-128`)", "q8_0": "Q8_0",
         "q4_0": "Q4_0"}
INT4 = ("int4wo-128", "8da4w-128")
QUANTIZED = ("int8dq", "int8wo", *INT4, "int8dq-shared-8da4w-128")


def int8_gemm_rate(tokens: int = 1024, hidden: int = 1536, inter: int = 6144) -> float:
    """OP/s of our W8A8 kernel at the E2B MLP shapes (the int8 GEMM this engine runs on this CPU)."""
    import torch

    from impl.kernels import cpu_fused
    from impl.kernels.cpu_fused import linear as cpu_linear
    from impl.quant.base import WeightFormat
    from impl.quant.pack import pack

    ext = cpu_fused.load()
    if ext is None:
        return 0.0
    torch.set_num_threads(2)
    fmt = WeightFormat("w8a8")
    up, down = (pack(torch.randn(n, k, dtype=torch.bfloat16) * 0.02, fmt) for n, k in ((2 * inter, hidden), (hidden, inter)))
    x, y = torch.randn(tokens, hidden), torch.randn(tokens, inter)
    native = cpu_linear.native_bf16()
    secs = min_seconds(lambda: (ext.linear(x, up, native), ext.linear(y, down, native)), 2)
    return 2.0 * tokens * (2 * inter * hidden + hidden * inter) / secs


def limits() -> dict:
    lim = measure_limits()
    lim["gemm_int8_ops"] = int8_gemm_rate()
    return lim


def phase_ours(args) -> None:
    model = bench_llamacpp.resolve_model(args.model)
    from impl.config.model_config import ModelConfig

    vocab = ModelConfig.from_pretrained(model).vocab_size
    log_dir = os.path.join(args.out_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    for fmt in args.formats.split(","):
        for flag in [f.strip() == "on" for f in args.flags.split(",") if f.strip()]:
            lim = limits()
            print(f"limits: {json.dumps(lim)}; page cache warmed in {warm_page_cache(model):.0f} s", flush=True)
            srv = our_server(model, flag, free_port(), FORMATS[fmt].split())
            res = run_server(srv, vocab, args, log_dir)
            res.update(limits=lim, model=model, flag=flag, system="ours", format=fmt,
                       finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            with open(os.path.join(args.out_dir, f"quant-ours-{fmt}-{'on' if flag else 'off'}.json"), "w") as f:
                json.dump(res, f, indent=1)
            print(f"ours {fmt} flag {'on' if flag else 'off'}: peak RSS {res['peak_rss_bytes'] / 1e9:.2f} GB, (a) "
                  f"{res['concurrent']['tok_s']:.2f} tok/s, pp512 {res['pp512']['tok_s']:.1f} pp1024 "
                  f"{res['pp1024']['tok_s']:.1f} tg128 {res['tg128']['tok_s']:.2f} tok/s", flush=True)


def phase_llamacpp(args) -> None:
    lim = limits()
    with open(os.path.join(args.out_dir, "llamacpp-limits.json"), "w") as f:
        json.dump(lim, f, indent=1)
    args.quants = args.llama_quants
    bench_llamacpp.run(args)


def _load(out_dir: str, name: str) -> dict | None:
    path = os.path.join(out_dir, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def report(args) -> str:
    ours = {(f, fl): _load(args.out_dir, f"quant-ours-{f}-{fl}") for f in FORMATS for fl in ("off", "on")}
    llama = {q: _load(args.out_dir, f"llamacpp-{q}") for q in bench_llamacpp.QUANTS}
    have = [r for r in list(ours.values()) + list(llama.values()) if r]
    if not have:
        raise SystemExit(f"no results in {args.out_dir}; run --phase ours / llamacpp first")
    model = have[0]["model"]
    costs = model_costs(model, 1024)
    lims = [r["limits"] for r in ours.values() if r] or [_load(args.out_dir, "llamacpp-limits")]
    bw = max(lim["copy_bytes_per_s"] for lim in lims)
    f32 = max(lim["gemm_f32_flops"] for lim in lims)
    bf16 = max(lim["gemm_bf16_flops"] for lim in lims)
    i8 = max(lim.get("gemm_int8_ops", 0) for lim in lims)
    cpu = lims[0]["cpu"] if lims and lims[0] else have[0].get("cpu", "unknown")

    def row(system: str, weights: str, flag: str, r: dict, nbytes: float) -> str:
        c = r.get("concurrent") or {}
        rss = r.get("peak_rss_bytes")
        return (f"| {system} | {weights} | {flag} | {nbytes / 1e9:.2f} | {rss / 1e9:.2f} |" if rss else
                f"| {system} | {weights} | {flag} | {nbytes / 1e9:.2f} | - |") + (
            f" {c['ttft_median_s']:.1f} | {c['tok_s']:.2f} |" if c else " - | - |") + (
            f" {r['pp512']['tok_s']:.1f} | {r['pp1024']['tok_s']:.1f} | {r['tg128']['tok_s']:.2f} "
            f"({r['tg128']['tok_s'] * nbytes / bw:.0%}) |")

    def our_bytes(fmt: str, r: dict) -> float:
        q = r.get("quantization") or {}
        return q.get("decode_weight_bytes") or costs["decode_weight_bytes"]

    lines = [f"{SECTION} ({cpu_kind()})", "",
             "Command: `make bench-quant-full` (`bench/bench_quant_full.py --phase ours`, `--phase llamacpp`, "
             f"`--phase report --write-docs`), one server at a time. Checkpoint `{os.path.basename(model)}` (the "
             "published E2B text shape at full size, vocabulary 262,144, bf16, well-conditioned weights). Ours with "
             "default flags and `--torchao-config` per row (quantized while loading); "
             + (f"llama.cpp from the source vendored in llama-cpp-python {bench_llamacpp.VERSION} "
                f"(`{' '.join(next((r['cmake'] for r in llama.values() if r), []))}`), "
                "GGUFs by its `convert_hf_to_gguf.py` (bf16) and `llama-quantize` (Q8_0, Q4_0), pp/tg by `llama-bench` "
                "(2 threads), (a) by `llama-server -np 4` with its prompt cache off. "
                if any(llama.values()) else "llama.cpp not run here (`--phase llamacpp` left no results). ")
             + f"2 threads everywhere. CPU: {cpu}.", "",
             f"Machine limits in the same run (measured before every server; the highest of each kept): copy bandwidth "
             f"{bw / 1e9:.1f} GB/s, float32 GEMM {f32 / 1e9:.0f} GFLOP/s, bf16 GEMM {bf16 / 1e9:.0f} GFLOP/s ("
             + ("oneDNN's on the CPU's native bf16 instructions, which our bf16 weights use" if bf16 > f32 else
                "oneDNN's; without native bf16 it emulates it, and our bf16 weights compute in float32")
             + "), int8 GEMM "
             f"{i8 / 1e9:.0f} GOP/s (our W8A8 kernel at the same shapes). tg128's bound: the bytes of weights one "
             "batch-1 decode step reads (column 4) over the copy bandwidth.", "",
             "| system | weights | fast prefill | GB read per decode step | peak RSS (GB) | (a) median TTFT (s) | "
             "(a) output tok/s | pp512 tok/s | pp1024 tok/s | tg128 tok/s (of bound) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (fmt, fl), r in ours.items():
        if r:
            lines.append(row("ours", LABEL[fmt], fl, r, our_bytes(fmt, r)))
    for q, r in llama.items():
        if r:
            lines.append(row("llama.cpp", LABEL.get(q, q), "-", r, r["decode_weight_bytes"]))
    lines += ["", *acceptance(ours, llama)]
    when = sorted(r["finished"] for r in have)
    lines += ["", f"Runs finished {when[0]} to {when[-1]}.", ""]
    return "\n".join(lines)


def common_prefix(ref: dict, cand: dict) -> str:
    """Mean common-prefix length of (a)'s greedy ids, candidate vs reference, as 'x.x / 16'."""
    pairs = list(zip(ref["concurrent"]["ids"], cand["concurrent"]["ids"]))
    lens = []
    for a, b in pairs:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        lens.append(n)
    return f"{sum(lens) / max(len(lens), 1):.1f} / {max((len(a) for a, _ in pairs), default=0)}"


def acceptance(ours: dict, llama: dict) -> list[str]:
    """Issue 32's ratios, from whatever ran."""
    out = []

    def best(fmts, key, flags=("on", "off")):
        rs = [(ours[(f, fl)][key]["tok_s"] if key != "concurrent" else ours[(f, fl)]["concurrent"]["tok_s"], f, fl)
              for f in fmts for fl in flags if ours.get((f, fl))]
        return max(rs) if rs else None

    for mine, peer, target in ((INT4, "q4_0", 1.2), (("int8dq", "int8wo"), "q8_0", 1.1)):
        b = best(mine, "tg128")
        if b and llama.get(peer):
            ratio = b[0] / llama[peer]["tg128"]["tok_s"]
            out.append(f"- tg128, ours {b[1]} (flag {b[2]}) / llama.cpp {peer.upper()}: {b[0]:.2f} / "
                       f"{llama[peer]['tg128']['tok_s']:.2f} = **{ratio:.2f}x** (issue 32 asks >= {target}x).")
    base = ours.get(("bf16", "on"))
    for fmt in QUANTIZED:
        r = ours.get((fmt, "on"))
        if r and base:
            out.append(f"- pp1024 with the flag, ours {fmt} / ours bf16: {r['pp1024']['tok_s'] / base['pp1024']['tok_s']:.2f}x.")
    lbest = max(((r["pp1024"]["tok_s"], q) for q, r in llama.items() if r), default=None)
    mbest = best(FORMATS, "pp1024", ("on",))
    if lbest and mbest:
        out.append(f"- pp1024 with the flag, ours at its best ({mbest[1]}) / llama.cpp at its best ({lbest[1]}): "
                   f"**{mbest[0] / lbest[0]:.1f}x** (issue 32 asks >= 8x).")
    int4 = [ours.get((f, fl)) for f in INT4 for fl in ("off", "on")]
    rss = [r["peak_rss_bytes"] for r in int4 if r and r.get("peak_rss_bytes")]
    if rss:
        q4 = (llama.get("q4_0") or {}).get("peak_rss_bytes")
        out.append(f"- Peak RSS with int4 weights: {max(rss) / 1e9:.2f} GB (issue 32 asks <= 5 GB)"
                   + (f"; llama.cpp Q4_0: {q4 / 1e9:.2f} GB." if q4 else "."))
    agree = []
    ref = ours.get(("bf16", "on")) or ours.get(("bf16", "off"))
    for fmt in QUANTIZED:
        r = ours.get((fmt, "on")) or ours.get((fmt, "off"))
        if r and ref:
            agree.append(f"ours {fmt} {common_prefix(ref, r)}")
    for q in ("q8_0", "q4_0"):
        if llama.get(q) and llama.get("bf16"):
            agree.append(f"llama.cpp {q.upper()} {common_prefix(llama['bf16'], llama[q])}")
    if agree:
        out.append("- Greedy agreement with the same engine's bf16 weights on (a)'s 4 prompts x 16 tokens (mean common "
                   "prefix; a small sample, the accuracy yardstick is [accuracy.md](accuracy.md)): " + "; ".join(agree) + ".")
    for fmt in FORMATS:
        off, on = ours.get((fmt, "off")), ours.get((fmt, "on"))
        if off and on:
            same = sum(a == b for a, b in zip(off["concurrent"]["ids"], on["concurrent"]["ids"]))
            out.append(f"- Greedy ids of (a), ours {fmt} flag on vs off: {same}/{len(on['concurrent']['ids'])} requests identical.")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=("ours", "llamacpp", "report"), required=True)
    bench_llamacpp.add_args(ap)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--flags", default="off,on")
    ap.add_argument("--llama-quants", default=",".join(bench_llamacpp.QUANTS))
    ap.add_argument("--concurrent-only", action="store_true")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.phase == "ours":
        phase_ours(args)
    elif args.phase == "llamacpp":
        phase_llamacpp(args)
    else:
        print_section(report(args), args.write_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
