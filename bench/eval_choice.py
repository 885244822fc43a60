"""Multiple-choice accuracy through the HTTP API (MMLU's file format), fast prefill off vs on (and MTP).

Data: ``--data-dir DIR`` reads MMLU's CSV layout (``DIR/test/<subject>_test.csv`` or
``DIR/<subject>_test.csv``; rows ``question,A,B,C,D,answer``, no header). Without it a
seeded synthetic set in the same format is written to a temporary folder and read back
through the same reader (this machine has no network): arithmetic questions with four
numeric choices.

Each question becomes MMLU's zero-shot prompt ("The following are multiple choice
questions (with answers) about <subject>. ... Answer:"), sent to POST /generate with
``max_new_tokens=1`` and the top logprobs of the next token; the chosen answer is the
letter (" A" / "A" ...) with the highest logprob. Accuracy is reported per
configuration, and the chosen answers must be identical across configurations (exit 1
otherwise).

Servers: ``--url NAME=URL`` (repeatable) measures running servers; otherwise this script
launches ours per configuration (``off``, ``on``, ``MTP``, ``MTP + on``) on ``--model-path`` (default:
the embedded tiny e2b), prefill on triton; a configuration the server refuses is
reported as refused.

    python -m bench.eval_choice                      # N=500 synthetic, launches off / on / MTP / MTP + on
    python -m bench.eval_choice --data-dir ~/mmlu --url off=http://127.0.0.1:30000 --url on=http://127.0.0.1:30001
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx

LETTERS = "ABCD"


@dataclass(frozen=True)
class Question:
    subject: str
    question: str
    choices: tuple[str, str, str, str]
    answer: str  # "A".."D"

    def prompt(self) -> str:
        head = f"The following are multiple choice questions (with answers) about {self.subject.replace('_', ' ')}.\n\n"
        body = self.question + "".join(f"\n{L}. {c}" for L, c in zip(LETTERS, self.choices))
        return head + body + "\nAnswer:"


def read_mmlu(folder: str, limit: int, seed: int) -> list[Question]:
    files = sorted(glob.glob(os.path.join(folder, "test", "*_test.csv")) or glob.glob(os.path.join(folder, "*_test.csv")))
    if not files:
        raise ValueError(f"no MMLU test files (<subject>_test.csv) in {folder} or {folder}/test")
    out = []
    for f in files:
        subject = os.path.basename(f)[: -len("_test.csv")]
        with open(f, newline="", encoding="utf-8") as fh:
            for i, row in enumerate(csv.reader(fh)):
                if len(row) != 6 or row[5].strip() not in LETTERS:
                    raise ValueError(f"{f} row {i + 1}: expected question,A,B,C,D,answer (answer one of A-D), got {row[:6]}")
                out.append(Question(subject, row[0], (row[1], row[2], row[3], row[4]), row[5].strip()))
    random.Random(seed).shuffle(out)  # a subject mix when limited
    return out[:limit]


def write_synthetic(folder: str, n: int, seed: int) -> None:
    """``n`` seeded arithmetic questions in MMLU's layout, split over two subjects."""
    rng = random.Random(seed)
    rows: dict[str, list[list[str]]] = {"elementary_mathematics": [], "high_school_mathematics": []}
    for i in range(n):
        subject = "elementary_mathematics" if i % 2 == 0 else "high_school_mathematics"
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op, val = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
        wrong = set()
        while len(wrong) < 3:
            w = val + rng.choice([-1, 1]) * rng.randint(1, 12)
            if w != val:
                wrong.add(w)
        choices = [val, *sorted(wrong)]
        rng.shuffle(choices)
        rows[subject].append([f"What is {a} {op} {b}?", *map(str, choices), LETTERS[choices.index(val)]])
    os.makedirs(os.path.join(folder, "test"), exist_ok=True)
    for subject, rs in rows.items():
        with open(os.path.join(folder, "test", f"{subject}_test.csv"), "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rs)


WHOLE_VOCAB_MAX = 4096  # servers launched here return every next-token logprob up to this vocabulary size


def letter_ids(tokenizer_folder: str) -> dict[str, set[int]]:
    from tokenizers import Tokenizer

    path = os.path.join(tokenizer_folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(f"no tokenizer.json in {tokenizer_folder}: pass --tokenizer FOLDER")
    tok = Tokenizer.from_file(path)
    return {L: {tok.encode(s, add_special_tokens=False).ids[-1] for s in (f" {L}", L)} for L in LETTERS}


def choose(url: str, questions: list[Question], letters: dict[str, set[int]], top: int, batch: int) -> list[str | None]:
    """The letter with the highest next-token logprob per question (None when no letter is in the top ``top``)."""
    out: list[str | None] = []
    for i in range(0, len(questions), batch):
        part = questions[i : i + batch]
        body = {"text": [q.prompt() for q in part], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "top_logprobs_num": top}
        r = httpx.post(url + "/generate", json=body, timeout=3600)
        if r.status_code != 200:
            raise RuntimeError(f"POST {url}/generate answered {r.status_code}: {r.text[:300]}")
        for o in r.json():
            tops = {int(t): lp for lp, t, _ in o["meta_info"]["output_top_logprobs"][0]}
            best = {L: max((tops[t] for t in ids if t in tops), default=None) for L, ids in letters.items()}
            scored = [(lp, L) for L, lp in best.items() if lp is not None]
            out.append(max(scored)[1] if scored else None)
        print(f"  {min(i + batch, len(questions))}/{len(questions)}", end="\r", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def launch_lines(model: str | None, draft: str) -> dict[str, list[str]]:
    # --max-logprobs: the servers launched here return the whole next-token distribution of a small vocabulary
    base = (["--model-path", model] if model else []) + ["--attention-backend", "triton", "--decode-attention-backend",
                                                         "torch_native", "--max-logprobs", str(WHOLE_VOCAB_MAX)]
    mtp = [*base, "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", draft]
    return {"off": base, "on": [*base, "--kv-sharing-fast-prefill"], "MTP": mtp,
            "MTP + on": [*mtp, "--kv-sharing-fast-prefill"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_choice", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=None, help="MMLU folder (test/<subject>_test.csv); default: a seeded synthetic set")
    ap.add_argument("--num-questions", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--url", action="append", default=[], help="NAME=URL of a running server (repeatable)")
    ap.add_argument("--model-path", default=None, help="model for the servers this script launches (default: tiny e2b)")
    ap.add_argument("--configs", default="off,on,MTP,MTP + on")
    ap.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: the server's model folder)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--top-logprobs", type=int, default=20,
                    help="top_logprobs_num asked of --url servers (a letter outside it counts as no answer)")
    ap.add_argument("--output-file", default=None, help="append one JSON line with the results")
    args = ap.parse_args(argv)
    if args.num_questions < 1:
        ap.error("--num-questions must be >= 1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.data_dir:
        questions, source = read_mmlu(args.data_dir, args.num_questions, args.seed), f"MMLU CSVs in {args.data_dir}"
    else:
        with tempfile.TemporaryDirectory() as d:
            write_synthetic(d, args.num_questions, args.seed)
            questions = read_mmlu(d, args.num_questions, args.seed)
        source = f"synthetic arithmetic set in MMLU's format (seed {args.seed})"
    print(f"{len(questions)} questions from {source}")

    answers: dict[str, list[str | None]] = {}
    refused: dict[str, str] = {}
    t0 = time.time()
    if args.url:
        targets = [(n, u.rstrip("/"), None) for n, _, u in (s.partition("=") for s in args.url)]
        for name, url, _ in targets:
            answers[name] = _evaluate(name, url, questions, args, launched=False)
    else:
        from bench.serving.campaign import refusal
        from contracts.adapters import impl_http
        from impl.checkpoint_factory.checkpoints import tiny_checkpoint

        lines = launch_lines(args.model_path, tiny_checkpoint("assistant"))
        for name in args.configs.split(","):
            if name not in lines:
                ap.error(f"--configs: choose from {sorted(lines)}")
            try:
                server = impl_http.start(lines[name])
            except RuntimeError as e:
                refused[name] = refusal(str(e))
                print(f"{name}: refused at launch: {refused[name]}")
                continue
            try:
                answers[name] = _evaluate(name, server.url, questions, args, launched=True)
            finally:
                server.stop()
    names = list(answers)
    truth = [q.answer for q in questions]
    print(f"\n| configuration | accuracy | answered | same answers as {names[0] if names else '-'} |")
    print("|---|---:|---:|---:|")
    for n in names:
        acc = sum(a == t for a, t in zip(answers[n], truth)) / len(truth)
        same = sum(a == b for a, b in zip(answers[n], answers[names[0]]))
        print(f"| {n} | {acc:.3f} | {sum(a is not None for a in answers[n])}/{len(truth)} | {same}/{len(truth)} |")
    for n, why in refused.items():
        print(f"| {n} | refused | - | - |  ({why[:160]})")
    print(f"({time.time() - t0:.0f} s)")
    identical = all(answers[n] == answers[names[0]] for n in names)
    if args.output_file:
        with open(args.output_file, "a", encoding="utf-8") as f:
            f.write(json.dumps({"source": source, "n": len(questions), "identical": identical, "refused": refused,
                                "accuracy": {n: sum(a == t for a, t in zip(answers[n], truth)) / len(truth) for n in names}})
                    + "\n")
    if len(names) >= 2 and not identical:
        diff = [i for i in range(len(truth)) if len({answers[n][i] for n in names}) > 1]
        print(f"FAIL: chosen answers differ between configurations on {len(diff)} questions (first: {diff[:5]})")
        return 1
    if len(names) >= 2:
        print(f"chosen answers identical across {', '.join(names)} on all {len(truth)} questions")
    return 0


def _evaluate(name: str, url: str, questions: list[Question], args, launched: bool) -> list[str | None]:
    info = httpx.get(url + "/get_model_info", timeout=60).json()
    folder = args.tokenizer or info.get("tokenizer_path") or info.get("model_path")
    vocab = int(info.get("vocab_size") or 0)
    # the whole distribution when we launched the server and the vocabulary is small; else --top-logprobs
    # (servers cap it: SGLang-compatible ones at --max-logprobs, 20 by default here)
    top = vocab if launched and 0 < vocab <= WHOLE_VOCAB_MAX else args.top_logprobs
    print(f"{name}: {url} ({info.get('model_path')}, fast prefill {info.get('kv_sharing_fast_prefill')})")
    return choose(url, questions, letter_ids(folder), top, args.batch)


if __name__ == "__main__":
    sys.exit(main())
