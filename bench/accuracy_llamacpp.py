"""llama.cpp on the accuracy yardstick (``bench/accuracy.py``): its Q8_0 and Q4_0 against its own f32 GGUF of the
same checkpoint, beside our formats against our float32 weights (not a test; ``make accuracy-llamacpp``).

The checkpoint (``e2b_markov``, float32) goes to GGUF through ``bench/bench_llamacpp.py``: llama.cpp's
``convert_hf_to_gguf.py`` to f32, ``llama-quantize`` to Q8_0 and Q4_0. The converter reads a Gemma-style
``tokenizer.json``, and the tiny checkpoints ship a byte-level BPE, so it converts a copy of the folder (config and
weights linked, ``gemma_tokenizer.write_gemma_tokenizer_files`` at the same vocabulary size): prompts go in as
token ids, so the tokenizer's pieces never matter. Each GGUF is served by ``llama-server`` (2 threads, one slot,
float32 KV as ours with float32 weights, so only the weights differ) and measured with ``bench/accuracy.py``'s
prompts and metric code (``prompts_for``, ``score``):

* greedy: ``/completion`` with the prompt as token ids, temperature 0 / top_k 1, no penalties, ``n_predict``
  64, ``ignore_eos`` (llama-server masks the end-of-generation ids with a -inf logit bias for it; ours only does
  not stop on them: the count of such ids on the reference paths is printed, and is 0 on e2b_markov);
* distributions, teacher-forced: ``/completion`` on ``prompt + path[:t]``, ``n_predict`` 1, ``n_probs`` = the
  vocabulary size, ``post_sampling_probs`` false: llama-server then lists the softmax of the model's raw logits
  (``get_token_probabilities`` in ``tools/server/server-common.cpp``: before the sampler chain, so before the
  EOG bias and top_k), sorted, as ``top_logprobs``; a list shorter than the vocabulary is refused
  (``accuracy.dense``). The one token such a request samples is forced by a logit bias to a whole-character
  piece: llama-server drops a token's probabilities when its text ends inside a UTF-8 character (a byte piece).

Every request runs without llama-server's prompt cache (``cache_prompt`` false, ``--cache-ram 0``): each one
prefills its whole prompt (at most 112 tokens here, ~25 ms). With the cache on, a teacher-forced request that
reuses an earlier request's KV returned other distributions than the same request on a fresh server (KL up to
8e-3 between two passes of the same requests on the f32 GGUF, against 1e-6 without the cache) on this
sliding-window, KV-sharing model; the yardstick measures the model, so it takes the cache out.

Rows: our weight formats against our float32 weights (``accuracy.measure``, in the same run, so on the same
checkpoint build and CPU), llama.cpp Q8_0 and Q4_0 against llama.cpp f32 (along llama.cpp f32's greedy paths),
and the sanity row, llama.cpp f32 against our float32 engine (along ours).

``python -m bench.accuracy_llamacpp [--model e2b_markov] [--write-docs]``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from bench.accuracy import ACCURACY_MD, SettingResult, dense, measure, prompts_for, score, table
from bench.accuracy_settings import COMMON, F32, SETTINGS, Setting
from bench.bench_llamacpp import CACHE, THREADS, build, convert, source_dir

REFERENCE = "f32"  # the checkpoint is float32: its GGUF keeps every weight as it is
QUANTS = ("q8_0", "q4_0")
OURS = ("weights-w8a16", "weights-w8a8", "weights-w4a16", "weights-w4a8")  # beside them: ours against float32
# float32 KV, as ours with float32 weights (only the weights differ); no host-memory prompt cache (see the docstring)
SERVER_ARGS = ("-ctk", "f32", "-ctv", "f32", "--cache-ram", "0")
SECTION = "## llama.cpp on the same yardstick"
GREEDY = {"temperature": 0.0, "top_k": 1, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
          "dry_multiplier": 0.0, "ignore_eos": True, "cache_prompt": False, "return_tokens": True}


def llamacpp_dense(completion: dict[str, Any], vocab: int) -> list[float]:
    """Logprobs by id over the whole vocabulary from a ``/completion`` answer's first predicted token
    (``completion_probabilities[0].top_logprobs``: ``[{"id", "token", "bytes", "logprob"}, ...]``).

    Refuses post-sampling lists (``prob`` / ``top_probs``: after the sampler chain, not the model's softmax) and
    lists shorter than the vocabulary (a truncated KL)."""
    if not completion.get("completion_probabilities"):
        raise ValueError(f"no completion_probabilities in {sorted(completion)}: {json.dumps(completion)[:400]}")
    first = completion["completion_probabilities"][0]
    if "top_logprobs" not in first:
        raise ValueError("post-sampling probabilities (top_probs): ask with post_sampling_probs false")
    return dense([(e["logprob"], e["id"]) for e in first["top_logprobs"]], vocab)


def gguf_ready_copy(path: str, root: str, vocab: int) -> str:
    """A copy of checkpoint ``path`` llama.cpp's converter reads: config and weights linked, a Gemma-style
    tokenizer of ``vocab`` entries (made once)."""
    from impl.checkpoint_factory.gemma_tokenizer import write_gemma_tokenizer_files

    dest = os.path.join(root, os.path.basename(os.path.normpath(path)) + "-gemmatok")
    if os.path.isdir(dest):
        return dest
    tmp = dest + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in os.listdir(path):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.symlink(os.path.realpath(os.path.join(path, name)), os.path.join(tmp, name))
    shutil.copy(os.path.join(path, "config.json"), tmp)
    with open(os.path.join(path, "config.json")) as f:
        max_len = json.load(f).get("max_position_embeddings", 2048)
    write_gemma_tokenizer_files(tmp, model_max_length=max_len, vocab_size=vocab)
    os.rename(tmp, dest)
    return dest


def whole_piece_id(folder: str, text: str = "a") -> int:
    """The id of ``text`` (whole UTF-8, one character) in ``folder``'s tokenizer.json."""
    from tokenizers import Tokenizer

    tid = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).token_to_id(text)
    if tid is None:
        raise ValueError(f"{text!r} is not a piece of {folder}'s tokenizer")
    return tid


class LlamaServer:
    """One ``llama-server`` on a GGUF: 2 threads, one slot; requests without the prompt cache (``GREEDY``)."""

    def __init__(self, bin_dir: str, gguf: str, log_dir: str, extra: Sequence[str] = (), timeout: float = 300):
        from bench.bench_peer import Server, free_port

        port = free_port()
        self.name = os.path.basename(gguf)
        self.srv = Server(f"llama.cpp {self.name}", [os.path.join(bin_dir, "llama-server"), "-m", gguf, "-t",
                          str(THREADS), "-np", "1", "-c", "2048", "--swa-full", "--host", "127.0.0.1", "--port",
                          str(port), "--no-webui", *extra], {}, port)
        self.srv.start(log_dir, timeout)
        import httpx

        # one client for the run's thousands of requests (httpx.post built a client, and an SSL context, per call)
        self.http = httpx.Client(timeout=600)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post(f"{self.srv.url}/completion", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        outs = []
        for p in prompts:
            toks = self.completion({"prompt": p, "n_predict": new_tokens, **GREEDY})["tokens"]
            if len(toks) != new_tokens:
                raise RuntimeError(f"{self.name}: {len(toks)} of {new_tokens} greedy tokens")
            outs.append(list(toks))
        return outs

    def teacher_forced(self, prompts: list[list[int]], paths: list[list[int]], vocab: int, whole_piece: int
                       ) -> Iterator[tuple[int, int, list[float]]]:
        """(prompt index, position, logprobs over the vocabulary) at every position of ``paths``, as
        ``accuracy.teacher_forced`` yields them.

        The one token each request samples is forced (logit bias) to ``whole_piece``, an id whose text is whole
        UTF-8: llama-server holds back a token whose text ends inside a character (a byte piece), and its
        probabilities with it (``process_token`` in ``tools/server/server-context.cpp``). The bias acts in the
        sampler chain only; the probabilities read are the raw logits' softmax."""
        bias = {"logit_bias": [[whole_piece, 1000.0]]}
        for i, (p, path) in enumerate(zip(prompts, paths, strict=True)):
            for t in range(len(path)):
                out = self.completion({"prompt": p + path[:t], "n_predict": 1, "n_probs": vocab,
                                       "post_sampling_probs": False, **GREEDY, **bias})
                if out["tokens"] != [whole_piece]:
                    raise RuntimeError(f"{self.name}: sampled {out['tokens']}, not the forced {whole_piece}")
                yield i, t, llamacpp_dense(out, vocab)

    def stop(self) -> None:
        self.http.close()
        self.srv.stop()


def ours(path: str, prompts: list[list[int]], new_tokens: int, vocab: int):
    """Our float32 engine (the yardstick's reference for the weight formats): greedy paths and their
    teacher-forced distributions."""
    from bench.accuracy import build_engine, greedy, teacher_forced

    engine = build_engine(["--model-path", path, *COMMON, *F32])
    try:
        paths = greedy(engine, prompts, new_tokens)
        return paths, list(teacher_forced(engine, prompts, paths, vocab))
    finally:
        engine.shutdown()


def tensor_types(cache: str, gguf: str) -> str:
    """``gguf``'s tensors counted by type, e.g. "240 Q4_0, 1 Q8_0, 36 F16, 264 F32" (llama.cpp's own reader)."""
    gguf_py = os.path.join(source_dir(cache), "gguf-py")
    if gguf_py not in sys.path:
        sys.path.insert(0, gguf_py)
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(gguf).tensors)
    return ", ".join(f"{n} {k}" for k, n in counts.most_common())


def ours_setting(setting: Setting, path: str, prompts: list[list[int]], new_tokens: int) -> SettingResult:
    """One of ``make accuracy``'s settings, measured by ``accuracy.measure`` in this run."""
    engines: dict = {}
    try:
        return measure(setting, path, prompts, new_tokens, engines, {}, log=lambda *_: None)
    finally:
        for e in engines.values():
            e.shutdown()


def eog_count(paths: Sequence[Sequence[int]], eog: Sequence[int]) -> int:
    return sum(t in eog for p in paths for t in p)


def section(model: str, results: list[SettingResult], notes: list[str], command: str, cpu: str, prompt_note: str,
            seconds: float) -> str:
    return "\n".join([
        SECTION,
        "",
        f"Command: `{command}`. CPU: {cpu}. llama.cpp: llama-cpp-python's vendored copy, `llama-server` with "
        f"{THREADS} threads. The {model} checkpoint, {results[0].prompts} prompts ({prompt_note}, 8-48 tokens) x "
        f"{results[0].new_tokens} greedy tokens and the metric code are `make accuracy`'s (`bench/accuracy.py`); each "
        f"engine's quantized weights against its own unquantized (float32) weights, our rows measured in the same run; "
        f"{seconds:.0f} s.",
        "",
        table(results),
        "",
        "\n\n".join(notes),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy_llamacpp", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="e2b_markov", help="checkpoint name (impl.checkpoint_factory.checkpoints) or folder")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="our engine's torch threads")
    ap.add_argument("--cache", default=CACHE, help="llama.cpp's build (bench/bench_llamacpp.py)")
    ap.add_argument("--quants", default=",".join(QUANTS), help="llama-quantize types measured against f32")
    ap.add_argument("--ours", default=",".join(OURS), help="our settings (bench/accuracy_settings.py) in the table")
    ap.add_argument("--server-args", default=" ".join(SERVER_ARGS), help="more llama-server arguments, on every GGUF")
    ap.add_argument("--write-docs", action="store_true", help=f"write the section into {os.path.relpath(ACCURACY_MD)}")
    args = ap.parse_args(argv)

    import torch

    from bench.docs_section import print_section
    from bench.machine import cpu_description
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint
    from impl.checkpoint_factory.tokenizer_factory import GENERATION_EOS_IDS
    from impl.config.model_config import ModelConfig

    torch.set_num_threads(args.threads)
    path = args.model if os.path.isdir(args.model) else tiny_checkpoint(args.model)
    model = os.path.basename(os.path.normpath(args.model))
    cfg = ModelConfig.from_pretrained(path)
    vocab = cfg.vocab_size
    prompts, note = prompts_for(model, path, args.prompts, args.seed, vocab)
    t0 = time.perf_counter()
    bin_dir = build(args.cache)
    copy = gguf_ready_copy(path, os.path.join(args.cache, "hf"), vocab)
    quants = [q for q in args.quants.split(",") if q]
    extra = shlex.split(args.server_args)
    ggufs = convert(args.cache, copy, os.path.join(args.cache, "gguf"), (REFERENCE, *quants), reference=REFERENCE)
    piece = whole_piece_id(copy)
    log_dir = os.path.join(args.cache, "logs")
    os.makedirs(log_dir, exist_ok=True)

    results = []
    for name in [n for n in args.ours.split(",") if n]:  # our formats, same run, checkpoint and CPU
        print(f"ours {name}", flush=True)
        results.append(ours_setting(SETTINGS[name], path, prompts, args.new_tokens))
    print("ours float32", flush=True)
    our_paths, our_tf = ours(path, prompts, args.new_tokens, vocab)
    greedy_paths: dict[str, list[list[int]]] = {}
    tf: dict[tuple[str, str], list] = {}  # (gguf quant, whose paths) -> teacher-forced distributions
    for q in (REFERENCE, *quants):
        print(f"llama.cpp {q}: {ggufs[q]}", flush=True)
        srv = LlamaServer(bin_dir, ggufs[q], log_dir, extra)
        try:
            greedy_paths[q] = srv.greedy(prompts, args.new_tokens)
            if q == REFERENCE:
                tf[(q, "ours")] = list(srv.teacher_forced(prompts, our_paths, vocab, piece))
            tf[(q, REFERENCE)] = list(srv.teacher_forced(prompts, greedy_paths[REFERENCE], vocab, piece))
        finally:
            srv.stop()

    ref_name = os.path.basename(ggufs[REFERENCE])
    server = ("llama-server", *extra, "-m")
    for q in quants:
        s = Setting(f"llamacpp-{q}", (*server, ref_name), (*server, os.path.basename(ggufs[q])),
                    f"llama.cpp {q.upper()} vs llama.cpp f32 GGUF")
        results.append(score(s, args.new_tokens, greedy_paths[REFERENCE], greedy_paths[q], tf[(REFERENCE, REFERENCE)],
                             tf[(q, REFERENCE)]))
    sanity = Setting("sanity", ("--dtype", "float32"), (*server, ref_name),
                     "llama.cpp f32 GGUF vs our float32 engine (the same weights)")
    results.append(score(sanity, args.new_tokens, our_paths, greedy_paths[REFERENCE], our_tf, tf[(REFERENCE, "ours")]))
    seconds = time.perf_counter() - t0

    eog = sorted({*cfg.eos_token_ids, *GENERATION_EOS_IDS})
    notes = [
        f"llama.cpp's files come from a copy of the checkpoint folder with a Gemma-style tokenizer.json of the same "
        f"{vocab} entries (`gemma_tokenizer.write_gemma_tokenizer_files`; its converter does not take the tiny "
        f"checkpoints' byte-level BPE); prompts go in as token ids, so the weights and ids are the checkpoint's. "
        f"Tensors by type: " + "; ".join(f"{q} {tensor_types(args.cache, ggufs[q])}" for q in quants) + ". "
        "llama-quantize keeps the norms and scalars in F32, and quantizes the tied embedding (which is also the "
        "LM head) to Q8_0 in both files (Q4_0's Q6_K for the output needs rows of 256: 64 here). A row not a "
        "multiple of 32 wide falls back to F16: the 35 8-wide per-layer projections and the per-layer embedding "
        "table (280 wide); the per-layer model projection stays F32. Q8_0 / Q4_0 weights meet activations "
        "quantized to Q8_0 (blocks of 32) in ggml's CPU dot products.",
        "Every request prefills its whole prompt: llama-server's prompt cache is off (with it on, a request reusing "
        "another's KV gave distributions up to 8e-3 nats away from the same request on a fresh server).",
        "The reference's own teacher-forced top-1 equals its greedy token at: "
        + ", ".join(f"{r.setting.name} {r.reference_tf_top1:.4f}" for r in results) + ".",
        f"End-of-generation ids {eog} on the reference paths (llama-server masks them under ignore_eos, ours does "
        f"not): ours {eog_count(our_paths, eog)}, llama.cpp f32 {eog_count(greedy_paths[REFERENCE], eog)}.",
    ]
    for r in results:
        print(f"{r.setting.name}: identical {r.identical:.3f}, mean common prefix {r.mean_prefix:.1f}/{r.new_tokens}, "
              f"mean KL {r.mean_kl:.3e} (max {r.max_kl:.3e}), teacher-forced top-1 {r.tf_top1:.4f} "
              f"(reference's own {r.reference_tf_top1:.4f})", flush=True)
    command = "python -m bench.accuracy_llamacpp " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = section(model, results, notes, command.strip(), cpu_description(), note, seconds)
    print_section(text, args.write_docs, ACCURACY_MD)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
