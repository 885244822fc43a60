"""Where one batched decode step's time goes: ``python -m bench.investigations.decode_step_split``.

bench_peer's batch (``e2b_bench``, float32, 32 requests with 128-1024-token prompts, greedy) prefilled once; then
``--steps`` decode steps over the cached prompts, ``--rounds`` times, each round printing ms per step and what the
layers' three compiled calls took of it (``attn_pre``: norm, q/k/v, head norms, RoPE; ``decode_attention``;
``decoder_post``: o_proj, MLP, norms, per-layer input) and the linears outside the layers (the LM head, the per-layer
input projection) beside the model forward as a whole (the rest of the forward: embedding, per-layer inputs, RoPE
tables, attention metadata, Python glue) and the step outside the forward (sampling, scheduling, output
processing). ``--model e2b-full-wc --dtype bfloat16 --requests 1 [--torchao-config 8da4w-128]``: batch-1 decode at
full size. The calls are timed by wrapping them (about a microsecond each). Then
``decoder_post`` of the first and the last layer is called alone in a loop on rows of the same shape (its weights
stay in cache there), beside its median call in the steps (where every layer's weights come from memory).
With ``--prefill`` each round splits one prefill chunk the same way instead (4 fresh 512-token prompts, the
server's 2048-token chunk; ``extend_attention`` in place of ``decode_attention``).
A benchmark, not a test: on a shared VM rounds differ by tens of percent; compare shares within a round.

(``bench.profile_step`` splits a full-size forward into the same calls under ``torch.profiler``; its Python tracer
slows the Python between the calls, which is a part this split measures, so the calls are wrapped here instead.)
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import time

from bench.machine import cpu_description


class _Timed:
    """An extension module whose calls add their wall time to ``totals[name]`` (and each ``decoder_post`` call's to
    ``calls``, when given)."""

    def __init__(self, ext, totals: collections.Counter, calls: list[float] | None = None):
        self._ext, self._totals, self._calls = ext, totals, calls

    def __getattr__(self, name):
        f = getattr(self._ext, name)
        if not callable(f):
            return f

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t
                self._totals[name] += dt
                if self._calls is not None and name == "decoder_post":
                    self._calls.append(dt)

        return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b_bench", help="checkpoint name (impl.checkpoint_factory.checkpoints)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", help="the engine's --dtype (bfloat16 at full size)")
    ap.add_argument("--torchao-config", default=None, help="quantized weights, e.g. 8da4w-128")
    ap.add_argument("--prefill", action="store_true",
                    help="split one prefill chunk instead (4 fresh 512-token prompts: the server's 2048-token chunk, "
                         "the cache flushed before each round)")
    args = ap.parse_args(argv)
    if min(args.requests, args.steps, args.rounds, args.threads) < 1:
        ap.error("--requests, --steps, --rounds and --threads must be at least 1")

    import torch

    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint
    from impl.engine import model_runner
    from impl.kernels import cpu_attn
    from impl.kernels.cpu_fused import transform

    torch.set_num_threads(args.threads)
    eng = Engine(tiny_checkpoint(args.model), dtype=args.dtype, chunked_prefill_size=2048,
                 **({"torchao_config": args.torchao_config} if args.torchao_config else {}))
    r = random.Random(0)
    ids = [[r.randrange(3, 500) for _ in range(r.randrange(128, 1024))] for _ in range(args.requests)]
    # the decode rounds' prompts prefilled (cached); --prefill: one short request, to build the kernels
    eng.generate(input_ids=ids[:1] if args.prefill else ids,
                 sampling_params={"max_new_tokens": 1, "ignore_eos": True, "temperature": 0})

    totals: collections.Counter = collections.Counter()
    layers = [o for o in gc.get_objects() if isinstance(o, transform.FusedLayerForward)]
    if not layers:
        print("no fused layer forwards installed (no C++ extension?): nothing to split")
        return 1
    layers.sort(key=lambda f: f.layer.layer_id)
    post_calls: dict[int, list[float]] = {}
    for i, layer in enumerate(layers):
        post_calls[i] = []
        layer.ext = _Timed(layer.ext, totals, post_calls[i])
    for lin in [o for o in gc.get_objects() if isinstance(o, transform.LinearForward)]:  # LM head, PLE projection
        lin.ext = _Timed(lin.ext, totals)
    attn = _Timed(cpu_attn._ext(), totals)
    cpu_attn._ext = lambda: attn
    forward = model_runner.ModelRunner.forward

    def timed_forward(self, *a, **k):
        t = time.perf_counter()
        try:
            return forward(self, *a, **k)
        finally:
            totals["forward"] += time.perf_counter() - t

    model_runner.ModelRunner.forward = timed_forward
    try:
        if args.prefill:
            _prefill_rounds(eng, args, totals)
        else:
            _rounds(eng, ids, args, layers, totals, post_calls, torch)
    finally:
        model_runner.ModelRunner.forward = forward
        eng.shutdown()
    return 0


_LINEARS = ("linear_native", "bf16_rows")  # LinearForward's calls: the linears outside the fused layers


def _what(args) -> str:
    return args.dtype + (f", --torchao-config {args.torchao_config}" if args.torchao_config else "")


def _rounds(eng, ids, args, layers, totals, post_calls, torch) -> None:
    print(f"{cpu_description()}; {args.model}, {_what(args)}, {args.requests} requests, {args.threads} threads")
    sp = {"max_new_tokens": args.steps + 1, "ignore_eos": True, "temperature": 0}
    for rnd in range(args.rounds):
        totals.clear()
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params=sp)
        steps = args.steps + 1  # the cached prompts' last token is recomputed: one extend step, then the decode steps
        per = {k: 1000 * v / steps for k, v in totals.items()}
        step = 1000 * (time.perf_counter() - t) / steps
        linears = sum(per.get(k, 0.0) for k in _LINEARS)
        calls = sum(per.get(k, 0.0) for k in ("attn_pre", "decode_attention", "decoder_post")) + linears
        print(f"round {rnd}: {step:.1f} ms a step: attn_pre {per.get('attn_pre', 0):.1f}, decode_attention "
              f"{per.get('decode_attention', 0):.1f}, decoder_post {per.get('decoder_post', 0):.1f}, LM head and "
              f"other linears {linears:.1f}, rest of the forward {per.get('forward', 0) - calls:.1f}, outside the "
              f"forward {step - per.get('forward', 0):.1f}")
    for i in (0, len(layers) - 1):
        in_step = sorted(post_calls[i])[len(post_calls[i]) // 2]
        print(f"layer {layers[i].layer.layer_id} decoder_post: median in the steps {in_step * 1e6:.0f} us, alone "
              f"{_post_alone(layers[i], args.requests, torch) * 1e6:.0f} us ({args.requests} rows)")


def _prefill_rounds(eng, args, totals) -> None:
    print(f"{cpu_description()}; {args.model}, {_what(args)}, one 2048-token prefill chunk (4 x 512), {args.threads} "
          "threads")
    r = random.Random(1)
    for rnd in range(args.rounds):
        eng.flush_cache()
        ids = [[r.randrange(3, 500) for _ in range(512)] for _ in range(4)]
        totals.clear()
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "ignore_eos": True, "temperature": 0})
        wall, fwd = 1000 * (time.perf_counter() - t), 1000 * totals["forward"]
        ms = {k: 1000 * totals[k] for k in ("attn_pre", "extend_attention", "decoder_post")}
        ms["linears"] = 1000 * sum(totals[k] for k in _LINEARS)
        rest = fwd - sum(ms.values())
        print(f"round {rnd}: {wall:.0f} ms: " + ", ".join(f"{k} {v:.0f} ({100 * v / wall:.0f}%)" for k, v in ms.items())
              + f", rest of the forward {rest:.0f} ({100 * rest / wall:.0f}%), outside the forward {wall - fwd:.0f}")


def _post_alone(fused, rows: int, torch) -> float:
    """Seconds per ``decoder_post`` call of one fused layer on ``rows`` random rows, called 100 times in a row (best
    of 3): its weights in cache."""
    w, f, ext = fused.w, fused.f, fused.ext._ext
    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, w.input_norm.shape[0], generator=g)
    # the widths from the head norm and the layer (a quantized o_proj / gate is packed: its shape is not [out, in])
    attn = torch.randn(rows, f.q_heads * f.head_norm.shape[1], generator=g)
    ple = None if w.ple is None else torch.randn(rows, fused.layer.ple_dim, generator=g)

    def call():
        return ext.decoder_post(h, attn, f.o_proj, w.post_attention_norm, w.pre_feedforward_norm, f.gate_up, f.down,
                                w.post_feedforward_norm, ple, f.ple_gate, f.ple_proj,
                                None if w.ple is None else w.ple.norm, w.scalar, w.eps, f.onednn)

    for _ in range(10):
        call()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(100):
            call()
        best = min(best, (time.perf_counter() - t) / 100)
    return best


if __name__ == "__main__":
    raise SystemExit(main())
