"""llama.cpp as a peer at full size: built from the copy vendored in llama-cpp-python's sdist, the same checkpoint
converted to GGUF (bf16, Q8_0, Q4_0), measured as its users measure it (not a test; ``make bench-quant-full``).

* ``--phase build``: ``pip download --no-binary`` the sdist into ``.cache/llamacpp``, CMake-build
  ``llama-bench``, ``llama-server`` and ``llama-quantize`` (~10 min on 2 cores). ``GGML_NATIVE`` off and the
  CPU's own extensions named: AVX2/FMA/F16C everywhere, AVX-512 (+ VNNI, BF16) where the CPU has them; never
  its AMX path, which crashed in a VM on the Sapphire Rapids-class machine.
* ``--phase convert``: ``convert_hf_to_gguf.py`` (its ``gguf-py`` on the path, run by this venv's Python, its bf16
  rounding sliced: ``bench/llamacpp_convert.py``) to a bf16 GGUF, then ``llama-quantize`` to Q8_0 and Q4_0.
* ``--phase run``: per GGUF, ``llama-bench`` (pp512, pp1024, tg128; 2 threads, best of its repetitions'
  mean) and then ``llama-server`` (4 slots, prompt cache off) for (a): 4 concurrent 1024-token prompts, 16 new
  tokens each, greedy, streamed: median TTFT, output tok/s, and the server's peak RSS (its memory-mapped GGUF
  pages included, as ``ps`` shows them). JSON per GGUF into ``--out-dir`` (``llamacpp-<quant>.json``), read by
  ``bench/bench_quant_full.py --phase report``.

The GGUF's decode bytes (what one batch-1 step reads: every tensor except the per-layer-embedding table,
which is only gathered; the tied LM head is the embedding) come from the file's own tensor table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import threading
import time

from bench.bench_full import prompts_of, start_sampled
from bench.bench_peer import Server, free_port
from bench.machine import cpu_description, cpu_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = "0.3.36"  # llama-cpp-python's sdist: llama.cpp of October 2026, gemma4 supported
CACHE = os.path.join(ROOT, ".cache", "llamacpp")
TARGETS = ("llama-bench", "llama-server", "llama-quantize")
QUANTS = ("bf16", "q8_0", "q4_0")
THREADS = 2
GATHERED_ONLY = ("per_layer_token_embd",)  # tables a decode step gathers rows of (never read whole)


def source_dir(cache: str) -> str:
    return os.path.join(cache, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")


def cmake_options(flags: set[str]) -> list[str]:
    """The CPU's extensions, named (GGML_NATIVE off: its AMX path crashed in a VM on the AMX Xeon)."""
    opts = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    if "avx2" in flags:
        opts += ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
    if "avx512f" in flags:
        opts += ["-DGGML_AVX512=ON"]
        opts += ["-DGGML_AVX512_VNNI=ON"] if "avx512_vnni" in flags else []
        opts += ["-DGGML_AVX512_BF16=ON"] if "avx512_bf16" in flags else []
    return opts




def build(cache: str) -> str:
    """The build folder's bin (built once)."""
    src = source_dir(cache)
    bin_dir = os.path.join(src, "build", "bin")
    if all(os.path.exists(os.path.join(bin_dir, t)) for t in TARGETS):
        return bin_dir
    os.makedirs(cache, exist_ok=True)
    if not os.path.isdir(src):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", cache], check=True)
        with tarfile.open(os.path.join(cache, f"llama_cpp_python-{VERSION}.tar.gz")) as tar:
            tar.extractall(cache, filter="data")
    opts = cmake_options(cpu_flags())
    print(f"llama.cpp: cmake {' '.join(opts)}", flush=True)
    subprocess.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", *opts], cwd=src, check=True)
    subprocess.run(["cmake", "--build", "build", f"-j{os.cpu_count() or 2}", "--target", *TARGETS], cwd=src, check=True)
    return bin_dir


def gguf_path(out_dir: str, model: str, quant: str) -> str:
    return os.path.join(out_dir, f"{os.path.basename(model.rstrip('/'))}-{quant}.gguf")


def convert(cache: str, model: str, gguf_dir: str, quants=QUANTS, reference: str = "bf16") -> dict[str, str]:
    """The GGUFs of ``model`` (made once each): ``reference`` (bf16, or f32 for a float32 checkpoint) by the
    converter, the rest by llama-quantize from it."""
    src = source_dir(cache)
    if not os.path.isdir(src):
        build(cache)  # fetches the source
    os.makedirs(gguf_dir, exist_ok=True)
    ref = gguf_path(gguf_dir, model, reference)
    if not os.path.exists(ref):
        subprocess.run([sys.executable, "-m", "bench.llamacpp_convert", src, model, "--outtype", reference,
                        "--outfile", ref + ".part"], cwd=ROOT, check=True)
        os.replace(ref + ".part", ref)
    out = {reference: ref}
    for q in quants:
        if q == reference:
            continue
        path = gguf_path(gguf_dir, model, q)
        if not os.path.exists(path):
            subprocess.run([os.path.join(build(cache), "llama-quantize"), ref, path + ".part", q.upper(), str(THREADS)],
                           check=True)
            os.replace(path + ".part", path)
        out[q] = path
    return out


def decode_bytes(cache: str, gguf: str) -> tuple[int, dict[str, int]]:
    """Bytes one batch-1 decode step reads (every tensor but the gathered tables) and bytes per tensor type."""
    gguf_py = os.path.join(source_dir(cache), "gguf-py")
    if gguf_py not in sys.path:
        sys.path.insert(0, gguf_py)
    from gguf import GGUFReader  # llama.cpp's own reader, from its source tree

    total = 0
    by_type: dict[str, int] = {}
    for t in GGUFReader(gguf).tensors:
        if any(t.name.startswith(g) for g in GATHERED_ONLY):
            continue
        total += int(t.n_bytes)
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return total, by_type


def llama_bench(bin_dir: str, gguf: str, reps: int) -> dict:
    out = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", gguf, "-p", "512,1024", "-n", "128",
                          "-t", str(THREADS), "-r", str(reps), "-o", "json"], capture_output=True, text=True, check=True)
    res = {}
    for row in json.loads(out.stdout):
        key = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        res[key] = {"tok_s": row["avg_ts"], "stddev": row["stddev_ts"], "runs": row.get("samples_ts")}
    return res


def completion(url: str, prompt: list[int], n: int, t0: float, out: dict) -> None:
    """One greedy streamed request on llama-server's own /completion (token-id prompt, prompt cache off)."""
    import httpx

    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True, "stream": True,
            "cache_prompt": False, "return_tokens": True}
    out.update(ids=[], t_first=None)
    try:
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=None) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                return
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                chunk = json.loads(line[5:])
                toks = chunk.get("tokens") or []
                if toks and out["t_first"] is None:
                    out["t_first"] = time.perf_counter() - t0
                out["ids"] += toks
                if chunk.get("stop"):
                    out["timings"] = chunk.get("timings")
                    break
    except Exception as e:  # noqa: BLE001 - reported per request
        out["error"] = f"{type(e).__name__}: {e}"
    out["t_end"] = time.perf_counter() - t0


def concurrent(bin_dir: str, gguf: str, vocab: int, seed: int, log_dir: str, timeout: float) -> dict:
    """(a) on llama-server: 4 slots of 1040 tokens each, 4 x 1024-token prompts at once, 16 new tokens each."""
    port = free_port()
    srv = Server(f"llama.cpp {os.path.basename(gguf)}", [os.path.join(bin_dir, "llama-server"), "-m", gguf, "-t", str(THREADS),
                 "-np", "4", "-c", str(4 * 1040), "--host", "127.0.0.1", "--port", str(port), "--no-webui"], {}, port)
    load_s, box = start_sampled(srv, log_dir, timeout)
    try:
        completion(srv.url, prompts_of(99, [16], vocab)[0], 2, time.perf_counter(), {})  # warm-up
        res: list[dict] = [{} for _ in range(4)]
        start = time.perf_counter()
        threads = [threading.Thread(target=completion, args=(srv.url, p, 16, start, r))
                   for p, r in zip(prompts_of(seed, [1024] * 4, vocab), res)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        errors = [r["error"] for r in res if r.get("error")]
        if errors:
            raise RuntimeError(f"{srv.name}: {errors[0]}")
        result = {"load_s": load_s, "wall_s": wall, "tok_s": sum(len(r["ids"]) for r in res) / wall,
                  "ttft_median_s": statistics.median(r["t_first"] for r in res), "ids": [r["ids"] for r in res]}
    finally:
        srv.stop()
        peak = box[0].stop() if box else None
    result["peak_rss_bytes"] = peak
    return result


def run(args) -> None:
    from impl.config.model_config import ModelConfig

    model = resolve_model(args.model)
    vocab = ModelConfig.from_pretrained(model).vocab_size
    bin_dir = build(args.cache)
    ggufs = convert(args.cache, model, args.gguf_dir, args.quants.split(","))
    log_dir = os.path.join(args.out_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    for q in args.quants.split(","):
        gguf = ggufs[q]
        nbytes, by_type = decode_bytes(args.cache, gguf)
        res = {"system": "llama.cpp", "quant": q, "gguf": gguf, "gguf_bytes": os.path.getsize(gguf), "model": model,
               "decode_weight_bytes": nbytes, "decode_bytes_by_type": by_type, "cpu": cpu_description(),
               "cmake": cmake_options(cpu_flags()), "version": f"llama-cpp-python {VERSION} (vendored llama.cpp)"}
        res.update(llama_bench(bin_dir, gguf, args.reps))
        print(f"llama.cpp {q}: pp512 {res['pp512']['tok_s']:.1f} pp1024 {res['pp1024']['tok_s']:.1f} "
              f"tg128 {res['tg128']['tok_s']:.2f} tok/s ({nbytes / 1e9:.2f} GB per decode step)", flush=True)
        if not args.skip_concurrent:
            res["concurrent"] = concurrent(bin_dir, gguf, vocab, args.seed, log_dir, args.startup_timeout)
            res["peak_rss_bytes"] = res["concurrent"].pop("peak_rss_bytes")
            print(f"llama.cpp {q}: (a) {res['concurrent']['tok_s']:.2f} tok/s, TTFT "
                  f"{res['concurrent']['ttft_median_s']:.1f} s, peak RSS {(res['peak_rss_bytes'] or 0) / 1e9:.2f} GB", flush=True)
        res["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        with open(os.path.join(args.out_dir, f"llamacpp-{q}.json"), "w") as f:
            json.dump(res, f, indent=1)


def resolve_model(name: str) -> str:
    if os.path.isdir(name):
        return name
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    return tiny_checkpoint(name)  # built on first use (the full-size ones take minutes and ~9 GB)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="e2b-full-wc", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--quants", default=",".join(QUANTS))
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions (-r)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=CACHE, help="where the sdist is unpacked and llama.cpp built")
    ap.add_argument("--gguf-dir", default=os.path.join(CACHE, "gguf"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache", "bench_full"))
    ap.add_argument("--skip-concurrent", action="store_true", help="llama-bench only, no llama-server run")
    ap.add_argument("--startup-timeout", type=float, default=2400)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=("build", "convert", "run"), required=True)
    add_args(ap)
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.phase == "build":
        print(build(args.cache))
    elif args.phase == "convert":
        print(json.dumps(convert(args.cache, resolve_model(args.model), args.gguf_dir, args.quants.split(",")), indent=1))
    else:
        run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
