"""Where one full-size forward's time goes: a 1024-token prefill (flag on and off) and batch-1 decode steps, in
process, split by the engine's top-level calls (a benchmark, not a test; ``make profile-prefill``).

    python -m bench.profile_step [--model e2b-full-wc] [--prompt 1024] [--decode-steps 16]
                                 [--server-args "--torchao-config 8da4w-128"] [--write-docs]

The engine runs as the server builds it (default flags, bf16 weights unless ``--server-args`` says otherwise,
2 threads). ``torch.profiler`` with its Python tracer times every call the forward makes; the phases are the
calls that own the time, so nothing is counted twice:

* ``attn_pre``: the q / k / v projection, the head norms and RoPE (one C++ call per layer);
* attention: the extend and decode attention kernels;
* ``decoder_post``: o_proj, the MLP (gate / up, GELU, down), the per-layer-input gate and the norms (one C++
  call per layer: its matmuls dominate it);
* other linears: the LM head and the per-layer-input projection (the extension's ``linear`` /
  ``linear_native``);
* ``ple_inputs``: a bf16 model's per-layer inputs after their projection, in one pass;
* gathers: the embedding and per-layer-embedding rows (``FileRows`` reads, ``index_select``);
* other torch ops, and the rest (Python, the scheduler, sampling) as the wall time not covered above.

Each phase is also given as a share of the machine's bound: prefill's FLOPs (``bench_full.model_costs``) over
the float32 / bf16 GEMM rate measured in the same run, decode's weight bytes over the copy bandwidth. Run it on
a quiet machine; the table goes into ``docs/benchmarks.md`` under the CPU kind it ran on.
"""

from __future__ import annotations

import argparse
import shlex
import time
from collections import defaultdict

from bench.docs_section import print_section
from bench.machine import cpu_description, cpu_kind

SECTION = "## Where a full-size forward's time goes"
PHASES = (
    ("attention inputs (`attn_pre`: q/k/v projection, head norms, RoPE)", ("attn_pre",)),
    ("attention kernels", ("extend_attention", "decode_attention", "rows_attention")),
    ("after attention (`decoder_post`: o_proj, MLP, PLE gate, norms)", ("decoder_post",)),
    ("LM head and per-layer-input projection (`linear`)", ("method linear of", "method linear_native of")),
    ("per-layer inputs after the projection (`ple_inputs`: scales, norm, sum)", ("method ple_inputs of",)),
    ("embedding and PLE gathers", ("FileRows", "aten::index_select", "aten::embedding")),
)


def _phase(key: str) -> str | None:
    for name, marks in PHASES:
        if any(m in key for m in marks):
            return name
    return None


def profile_run(fn) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per phase) of ``fn()`` under the profiler. A phase's call is counted with what it
    calls, once: a call inside another phase's call (the Python wrapper of a kernel and the kernel itself) is not
    counted again. Self time of torch ops outside every phase goes to "other torch ops"."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
    out: dict[str, float] = defaultdict(float)
    for e in prof.events():
        p, inside = e.cpu_parent, False
        while p is not None and not inside:
            inside, p = _phase(p.name) is not None, p.cpu_parent
        if inside:
            continue
        ph = _phase(e.name)
        if ph is not None:
            out[ph] += e.cpu_time_total / 1e6  # the call, with what it calls
        elif e.name.startswith("aten::"):
            out["other torch ops"] += e.self_cpu_time_total / 1e6
    return wall, dict(out)


# The server flags an in-process engine of the investigations takes from --server-args (the rest are the server's)
ENGINE_KEYS = ("torchao_config", "torchao_config_kv_shared", "quantization", "dtype", "chunked_prefill_size")


def engine_kwargs(path: str, server_args: str) -> dict:
    """``Engine`` keyword arguments from a server command line's flags (``--server-args``), parsed and checked as the
    server parses them; only the ENGINE_KEYS the line sets."""
    from impl.args import ServerArgs

    extra = ServerArgs.parse(["--model-path", path, *shlex.split(server_args)])
    return {k: getattr(extra, k) for k in ENGINE_KEYS if getattr(extra, k, None)}


def _table(title: str, wall: float, phases: dict[str, float], bound: float, bound_what: str) -> list[str]:
    rows = [f"**{title}**: {wall * 1e3:.0f} ms; the machine's bound {bound * 1e3:.0f} ms ({bound_what}), so "
            f"{bound / wall:.0%} of it.", "", "| phase | ms | share |", "|---|---:|---:|"]
    covered = 0.0
    for name, _ in PHASES:
        v = phases.get(name, 0.0)
        covered += v
        rows.append(f"| {name} | {v * 1e3:.1f} | {v / wall:.0%} |")
    other = phases.get("other torch ops", 0.0)
    rest = max(0.0, wall - covered - other)
    rows += [f"| other torch ops | {other * 1e3:.1f} | {other / wall:.0%} |",
             f"| Python, scheduler, sampling (the rest of the wall time) | {rest * 1e3:.1f} | {rest / wall:.0%} |", ""]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--server-args", default="", help="extra server args, e.g. '--torchao-config 8da4w-128'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from bench.bench_full import measure_limits, model_costs
    from impl import Engine
    from bench.bench_llamacpp import resolve_model

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    limits = [measure_limits()]  # again after the runs: a shared machine's figures, the higher of each kept
    costs = model_costs(path, args.prompt)
    kw = engine_kwargs(path, args.server_args)
    ids = [(7 + 31 * i) % 200_000 + 100 for i in range(args.prompt)]
    weights = args.server_args or "bf16 weights"
    runs: list[tuple[str, float, dict[str, float], str]] = []  # (title, wall, phases, "prefill on/off" / "decode")
    decode_bytes = costs["decode_weight_bytes"]
    for flag in (True, False):
        eng = Engine(model_path=path, kv_sharing_fast_prefill=flag, random_seed=0, **kw)
        try:
            q = (eng.get_server_info().get("quantization") or {})
            decode_bytes = q.get("decode_weight_bytes") or decode_bytes
            sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
            eng.generate(input_ids=ids[:64], sampling_params=sp)  # warm the lazy kernels
            eng.flush_cache()
            wall, ph = profile_run(lambda: eng.generate(input_ids=ids, sampling_params=sp))
            runs.append((f"Prefill, {args.prompt} tokens, flag {'on' if flag else 'off'}", wall, ph,
                         "on" if flag else "off"))
            if flag:
                n = args.decode_steps
                eng.flush_cache()
                eng.generate(input_ids=ids[:64], sampling_params=sp)
                dsp = {"max_new_tokens": n + 1, "temperature": 0, "ignore_eos": True}
                wall, ph = profile_run(lambda: eng.generate(input_ids=ids[:64], sampling_params=dsp))
                # the first of the n + 1 tokens is the (cached) prompt's last row: counted as one more step
                runs.append((f"Decode, batch 1, per step (mean of {n + 1} steps after a 64-token prompt)",
                             wall / (n + 1), {k: v / (n + 1) for k, v in ph.items()}, "decode"))
        finally:
            eng.shutdown()
    limits.append(measure_limits())
    f32 = max(lim["gemm_f32_flops"] for lim in limits)
    bf16 = max(lim["gemm_bf16_flops"] for lim in limits)
    bw = max(lim["copy_bytes_per_s"] for lim in limits)
    lines = [f"{SECTION}: {args.model}, {weights} ({cpu_kind()})", "",
             f"Command: `python -m bench.profile_step --model {args.model} --prompt {args.prompt} --decode-steps "
             f"{args.decode_steps}" + (f" --server-args \"{args.server_args}\"" if args.server_args else "") + "` "
             f"(`make profile-prefill`). CPU: {cpu_description()}; {args.threads} threads. Machine limits measured "
             f"before and after the runs (the higher of each): float32 GEMM {f32 / 1e9:.0f} GFLOP/s, bf16 GEMM "
             f"{bf16 / 1e9:.0f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s.", ""]
    for title, wall, ph, kind in runs:
        if kind == "decode":
            lines += _table(title, wall, ph, decode_bytes / bw,
                            f"{decode_bytes / 1e9:.2f} GB of weights over the copy bandwidth")
        else:
            flops = args.prompt * costs[f"flops_per_token_{kind}"] + costs["lm_head_flops"]
            lines += _table(title, wall, ph, flops / max(f32, bf16), f"{flops / 1e12:.2f} TFLOP at the faster GEMM rate")
    print_section("\n".join(lines), args.write_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
