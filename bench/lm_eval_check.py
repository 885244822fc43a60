"""lm-evaluation-harness against our server: a loglikelihood task through its ``local-completions`` model.

    python -m bench.lm_eval_check [--model e2b_markov] [--items 200] [--write-docs]      (make lm-eval)

lm-eval (``lm_eval[api]``, installed once into ``--venv`` beside its own CPU torch) scores multiple-choice items by
sending each context + choice as token ids to POST /v1/completions with ``echo: true, logprobs: 1, max_tokens: 1``
and summing the returned prompt logprobs of the choice's tokens (its ``parse_logprobs``). It tokenizes through the
server (``tokenizer_backend=remote``: GET /tokenizer_info, POST /tokenize), so nothing but the URL is given to it. The task is written here:
sentences of the Markov language the trained tiny checkpoint ``e2b_markov`` was trained on
(``impl/checkpoint_factory/markov_language.py``); the right choice continues the context with its last token's most
likely successor (probability 0.7 in the language), the wrong ones with the second and third (0.2, 0.1) and with a
token that never follows it, each choice then with its first token's most likely successor. Items whose text
does not re-encode to the same ids (byte-level BPE) are skipped, so lm-eval's tokenization gives exactly the ids
meant; the accuracy then says the server scores continuations the way the model was trained (chance is 0.25).

Our server is launched per configuration (fast prefill off, on); for each, lm-eval's logged loglikelihood of every
item and choice must equal the sum of the same tokens' prompt logprobs from POST /generate (``logprob_start_len`` at
the choice) within ``TOLERANCE``, the flag-on server's the flag-off server's, and both must choose the same answers.
(Not to the bit by default: lm-eval sends context + choice from token 0 and its four choices share the context, so
the radix cache and the rows beside a row change the float32 matmuls' row counts, and their rounding with them.
``--deterministic`` launches the servers with ``--enable-deterministic-inference --dtype bfloat16``, where each row's
bits do not depend on its batch, and demands equality to the bit; it needs native bf16, avx512_bf16 or AMX.)
Exit 1 on any difference. A check run by hand (it installs lm-eval once, ~2 minutes), not part of ``make test``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from bench.docs_section import print_section
from bench.machine import cpu_description

SECTION = "## lm-evaluation-harness against the server (`make lm-eval`)"
LM_EVAL_SPEC = "lm_eval[api]==0.4.13"
TOKENIZER_SPEC = "transformers==5.23.0"  # lm-eval's huggingface tokenizer backend (not in its [api] extra)
TORCH_SPEC = "torch==2.13.0"  # the local CPU build, before lm-eval pulls a CUDA one
TASK = "yoco_markov_mc"
CONFIGS = (("off", []), ("on", ["--kv-sharing-fast-prefill"]))
TOLERANCE = 1e-4  # |loglikelihood difference| allowed without --deterministic (float32 rounding by row count)
DETERMINISTIC = ["--enable-deterministic-inference", "--dtype", "bfloat16"]


def ensure_lm_eval(venv: str) -> str:
    """Path of ``lm_eval`` in ``venv``, installing it there first if needed."""
    exe = os.path.join(venv, "bin", "lm_eval")
    if os.path.exists(exe) and glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "transformers")):
        return exe
    print(f"installing {LM_EVAL_SPEC} into {venv} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    subprocess.run([pip, "install", "-q", TORCH_SPEC], check=True)
    subprocess.run([pip, "install", "-q", LM_EVAL_SPEC, TOKENIZER_SPEC], check=True)
    return exe


def make_items(model_path: str, count: int, seed: int) -> list[dict]:
    """``count`` items {context, choices, label, ids: [context ids, [choice ids]]} whose texts re-encode exactly."""
    from transformers import AutoTokenizer

    from impl.checkpoint_factory.markov_language import FIRST_ID, language_for

    tok = AutoTokenizer.from_pretrained(model_path)
    lang = language_for(model_path, 12)  # the e2b_markov recipe's seed
    succ = lang.successors
    rng = random.Random(seed)

    def exact(ids: list[int]) -> str | None:
        text = tok.decode(ids)
        return text if tok.encode(text, add_special_tokens=False) == ids else None

    items: list[dict] = []
    tries = 0
    while len(items) < count:
        tries += 1
        if tries > 2000 * count:
            raise RuntimeError(f"only {len(items)} of {count} items re-encode exactly; is {model_path} e2b_markov?")
        ctx = lang.sample(rng.randrange(4, 12), rng)
        last = ctx[-1]
        right = succ[last][0]
        never = rng.choice([t for t in range(FIRST_ID, lang.vocab) if t not in succ[last]])
        conts = [[t, succ[t][0]] for t in [right, succ[last][1], succ[last][2], never]]
        order = list(range(4))
        rng.shuffle(order)
        conts = [conts[i] for i in order]
        ctx_text = exact(ctx)
        if ctx_text is None or ctx_text != ctx_text.rstrip():  # lm-eval moves a context's trailing spaces
            continue
        wholes = [exact(ctx + c) for c in conts]
        if any(w is None or not w.startswith(ctx_text) for w in wholes):
            continue
        items.append({"context": ctx_text, "choices": [w[len(ctx_text):] for w in wholes],  # type: ignore[index]
                      "label": order.index(0), "ids": [ctx, conts]})
    return items


def write_task(folder: str, items: list[dict]) -> None:
    data = os.path.join(folder, "items.jsonl")
    with open(data, "w") as f:
        for it in items:
            f.write(json.dumps({k: it[k] for k in ("context", "choices", "label")}) + "\n")
    with open(os.path.join(folder, f"{TASK}.yaml"), "w") as f:
        f.write(f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
                "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\ntarget_delimiter: \"\"\n"
                "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


def run_lm_eval(exe: str, url: str, served: str, task_dir: str, out_dir: str) -> tuple[float, list]:
    """(acc, per-item lists of the choices' loglikelihoods, in the items' order) of one lm-eval run."""
    args = (f"model={served},base_url={url}/v1/completions,tokenizer_backend=remote,"
            "tokenized_requests=True,num_concurrent=2,max_retries=1")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [exe, "run", "--model", "local-completions", "--model_args", args, "--tasks", TASK, "--include_path",
           task_dir, "--output_path", out_dir, "--log_samples", "--batch_size", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res_file = sorted(glob.glob(os.path.join(out_dir, "**", "results_*.json"), recursive=True))[-1]
    acc = json.load(open(res_file))["results"][TASK]["acc,none"]
    samples_file = sorted(glob.glob(os.path.join(out_dir, "**", f"samples_{TASK}_*.jsonl"), recursive=True))[-1]
    per_item: dict[int, list] = {}
    for line in open(samples_file):
        s = json.loads(line)
        per_item[s["doc_id"]] = [float(r[0][0]) for r in s["resps"]]  # each choice: [[loglikelihood, is_greedy]]
    return acc, [per_item[i] for i in sorted(per_item)]


def generate_scores(url: str, items: list[dict]) -> list[list[float]]:
    """Each choice's loglikelihood from POST /generate: the sum of its tokens' prompt logprobs, in order."""
    import httpx

    out = []
    with httpx.Client(timeout=120) as client:
        for it in items:
            ctx, conts = it["ids"]
            row = []
            for c in conts:
                r = client.post(url + "/generate", json={"input_ids": ctx + c, "return_logprob": True,
                                                         "logprob_start_len": len(ctx),
                                                         "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
                r.raise_for_status()
                row.append(sum(lp for lp, _, _ in r.json()["meta_info"]["input_token_logprobs"]))
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="e2b_markov", help="checkpoint name (impl.checkpoint_factory.checkpoints)")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--venv", default=".cache/lmeval-venv", help="where lm-eval is (or gets) installed")
    ap.add_argument("--deterministic", action="store_true",
                    help=f"servers with {' '.join(DETERMINISTIC)}: equal to the bit (native bf16 CPUs)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    if args.items < 1:
        ap.error("--items must be at least 1")

    from contracts.adapters.impl_http import start
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    exe = ensure_lm_eval(args.venv)
    path = tiny_checkpoint(args.model)
    items = make_items(path, args.items, args.seed)
    tol = 0.0 if args.deterministic else TOLERANCE
    extra = DETERMINISTIC if args.deterministic else []
    rows, scores, failures = [], {}, []
    with tempfile.TemporaryDirectory(prefix="lm-eval-") as tmp:
        write_task(tmp, items)
        for name, flags in CONFIGS:
            server = start(["--model-path", path, *flags, *extra])
            try:
                served = json.loads(_get(server.url + "/v1/models"))["data"][0]["id"]
                t = time.perf_counter()
                acc, lm = run_lm_eval(exe, server.url, served, tmp, os.path.join(tmp, f"out-{name}"))
                wall = time.perf_counter() - t
                ref = generate_scores(server.url, items)
            finally:
                server.stop()
            diff = _max_diff(lm, ref)
            if diff > tol:
                failures.append(f"{name}: lm-eval's loglikelihoods differ from /generate's by up to {diff:.2g}")
            scores[name] = lm
            rows.append((name, acc, diff, wall))
    on_off = _max_diff(scores["on"], scores["off"])
    same_choice = sum(_argmax(a) == _argmax(b) for a, b in zip(scores["on"], scores["off"]))
    if on_off > tol or same_choice != len(items):
        failures.append(f"flag on vs off: loglikelihoods differ by up to {on_off:.2g}, "
                        f"{len(items) - same_choice} items choose another answer")
    how = " with " + " ".join(f"`{a}`" for a in DETERMINISTIC) if args.deterministic else " with default flags"
    lines = [SECTION, "",
             f"Command: `python -m bench.lm_eval_check --model {args.model} --items {args.items}"
             f"{' --deterministic' if args.deterministic else ''}` (`make lm-eval`). CPU: {cpu_description()}. "
             f"lm-eval {LM_EVAL_SPEC.split('==')[1]} (`local-completions` with the server's tokenizer: token-id prompts, `echo`, "
             "`logprobs: 1`, "
             f"2 concurrent requests) on a {args.items}-item multiple-choice task over the Markov language "
             f"`{args.model}` was trained on (4 choices of 2 tokens: the context's most likely successor against its second "
             "and third and a token that never follows it; chance 0.25); our server launched per "
             f"configuration on that checkpoint{how}. The last column: the largest difference between a "
             "loglikelihood lm-eval logged and the same tokens' prompt logprobs summed from POST /generate "
             f"(allowed: {tol:g}).", "",
             "| fast prefill | lm-eval acc | lm-eval wall (s) | largest difference from /generate |",
             "|---|---:|---:|---:|"]
    lines += [f"| {n} | {acc:.3f} | {wall:.1f} | {diff:.2g} |" for n, acc, diff, wall in rows]
    lines += ["", f"Flag on vs off: the same answer chosen on {same_choice}/{len(items)} items; loglikelihoods differ by "
              f"up to {on_off:.2g}."]
    if failures:
        lines += ["", "FAILED: " + "; ".join(failures)]
    print_section("\n".join(lines) + "\n", args.write_docs and not failures)
    return 1 if failures else 0


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _argmax(row: list[float]) -> int:
    return max(range(len(row)), key=row.__getitem__)


def _get(url: str) -> str:
    import httpx

    r = httpx.get(url, timeout=30)
    r.raise_for_status()
    return r.text


if __name__ == "__main__":
    raise SystemExit(main())
