"""What constrained decoding costs at Gemma-4's vocabulary size (not a test).

At 262,144 entries (the tiny tokenizer widened to that size, byte-level pieces, as
``impl/checkpoint_factory/full_size.py`` does) this measures, on the scheduler thread's path:

* the token table (once per engine) and grammar compile times: a typical schema, the largest
  the limits allow (an enum of 1,024, objects nested to the depth limit), a regex and an EBNF grammar;
* per decode step at batch 1 / 16 / 64: filling every row's bitmask (``GrammarState.fill``) and
  the sampler with the masks applied (``sample``), beside the same sampler call without masks;
  the masking's share of a step is ``(masked - plain) / step``, where a step is the model's
  forward plus the sampler (give ``--forward-ms`` for the full-size model's decode forward at
  that batch; by default the figures of docs/benchmarks.md's E2B full-size runs are not assumed,
  and only the absolute times are printed).

Usage: ``python -m bench.bench_structured [--rounds 5]`` (``make bench-structured``), under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

VOCAB = 262_144
TYPICAL = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
    "required": ["name", "age"]}


def _deep(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth - 1):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def _ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--forward-ms", type=float, nargs=3, default=None, metavar=("B1", "B16", "B64"),
                    help="the model's decode forward at batch 1 / 16 / 64, to print masking's share of a step")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from impl.constrained.bitmask import allocate
    from impl.constrained.grammar import GrammarBackend, GrammarKey
    from impl.model.tokenizer import Tokenizer
    from impl.sampling.sampler import SampleRow, sample
    from impl.sampling.sampling_params import SamplingParams
    from impl.checkpoint_factory.tokenizer_factory import train_tokenizer, widen_tokenizer

    tok = Tokenizer(path="widened", backend=widen_tokenizer(train_tokenizer(), VOCAB))
    backend = GrammarBackend(tok, VOCAB, [1, 5])
    t = time.perf_counter()
    backend.compiler  # noqa: B018 - builds the token table
    print(f"token table ({VOCAB} entries): {time.perf_counter() - t:.2f} s (once per engine)\n")

    grammars = {
        "typical JSON schema": GrammarKey("json_schema", json.dumps(TYPICAL)),
        "enum of 1,024": GrammarKey("json_schema", json.dumps({"enum": [f"value-{i}" for i in range(1024)]})),
        "11 nested objects (the depth limit)": GrammarKey("json_schema", json.dumps(_deep(11))),
        "regex (phone, email)": GrammarKey("regex", r"(\+[0-9]{1,3} )?[0-9]{3}-[0-9]{4}|[a-z.]+@[a-z]+\.(com|org)"),
        "EBNF arithmetic": GrammarKey("ebnf", 'root ::= e\ne ::= t ("+" t)*\nt ::= f ("*" f)*\nf ::= [0-9]+ | "(" e ")"'),
    }
    print("| grammar | compile (first) | compile (cached) |\n|---|---|---|")
    for name, key in grammars.items():
        t = time.perf_counter()
        backend.compile(key)
        first = 1e3 * (time.perf_counter() - t)
        cached = _ms(lambda: backend.compile(key), 3)
        print(f"| {name} | {first:.0f} ms | {cached:.2f} ms |")

    print("\n| batch | fill masks | sampler, masked | sampler, plain | masking adds | share of a step |\n|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for i, batch in enumerate((1, 16, 64)):
        states = [backend.new_state(grammars["typical JSON schema"]) for _ in range(batch)]
        for s in states:  # into a string value: most of the vocabulary allowed (the costly case)
            for t_ in tok.encode('{"name":"ab', add_special_tokens=False):
                s.accept(t_)
        logits = torch.randn(batch, VOCAB, generator=g)
        rows = [SampleRow(SamplingParams(temperature=0.0), [2], [], torch.Generator()) for _ in range(batch)]
        bitmask = allocate(batch, VOCAB)

        def fill() -> None:
            for j, s in enumerate(states):
                s.fill(bitmask, j)

        fill_ms = _ms(fill, args.rounds)
        masked_rows = [SampleRow(r.params, r.prompt_ids, r.output_ids, r.generator, token_bitmask=bitmask[j])
                       for j, r in enumerate(rows)]
        masked = _ms(lambda: sample(logits, masked_rows, [1]), args.rounds)
        plain = _ms(lambda: sample(logits, rows, [1]), args.rounds)
        adds = fill_ms + masked - plain
        share = "n/a (pass --forward-ms)"
        if args.forward_ms:
            share = f"{100 * adds / (args.forward_ms[i] + plain):.1f}%"
        print(f"| {batch} | {fill_ms:.2f} ms | {masked:.2f} ms | {plain:.2f} ms | {adds:.2f} ms | {share} |")
    backend.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
