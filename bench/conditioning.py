"""The three conditioning figures of a full-size recipe, on a reduced copy built in memory (float32).

The reduced copy keeps the recipe's widths and init (``impl/checkpoint_factory/full_size.py``'s per-tensor draws: the same
values a built checkpoint holds for the same names and shapes) on fewer layers (``--layers``: ``impl/checkpoint_factory/reduced.py``, the E2B pattern
cut to that length, the last two KV-shared) and optionally a smaller vocabulary (``--vocab``).
Prints, on random-id prompts:

1. eager vs sdpa: transformers' float32 eager and sdpa attention on the first generated token's top-10 logprobs
   at ``--length`` tokens (max abs difference over the prompts; the recipe asks <= 1e-4 at 1024);
2. every layer matters: zeroing one layer's ``o_proj`` (its attention output, so the post-attention norm adds
   nothing) moves those logprobs by at least this much, the minimum over layers of the max over prompts (>= 1e-2);
3. the top-1 margin: the fraction of ``--margin-prompts`` prompts whose first token's top-1 logprob exceeds the
   top-2 by more than 0.1 ("most").

``python -m bench.conditioning --recipe e2b-full-wc --layers 7`` (``--recipe e2b-full``: the chaotic clone).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass

import torch

from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, CheckpointRecipe
from impl.checkpoint_factory.reduced import reduced

TOP = 10


@dataclass(frozen=True)
class Figures:
    eager_vs_sdpa: float  # max abs top-10 logprob difference
    min_layer_effect: float  # min over layers of the max abs top-10 logprob move
    weakest_layer: int
    margin_fraction: float  # prompts with top-1 - top-2 > 0.1
    median_margin: float


def build_model(recipe: CheckpointRecipe):
    """transformers' Gemma4ForCausalLM in float32 holding the recipe's weights (drawn as the streamed writer
    draws them)."""
    from transformers import Gemma4ForCausalLM

    from impl.checkpoint_factory import full_size

    cfg = full_size.hf_config(recipe)
    model = Gemma4ForCausalLM(cfg).eval()
    sd = model.state_dict()
    with torch.no_grad():
        for spec in full_size.tensor_specs(dataclasses.replace(recipe, dtype="float32")):
            t = sd[spec.name]
            flat = t.view(-1)
            off = 0
            for block in full_size.tensor_values(spec, recipe.seed, recipe.init):
                flat[off:off + block.numel()] = block
                off += block.numel()
            assert off == t.numel(), spec.name
    model.tie_weights()
    return model


def first_token_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids]), logits_to_keep=1, use_cache=False).logits[0, -1].double()
    return torch.log_softmax(logits, -1)


def top10_diff(ref: torch.Tensor, other: torch.Tensor) -> float:
    idx = torch.topk(ref, TOP).indices
    return float((ref[idx] - other[idx]).abs().max())


def margin(lp: torch.Tensor) -> float:
    top2 = torch.topk(lp, 2).values
    return float(top2[0] - top2[1])


def measure(model, vocab: int, length: int, prompts: int, margin_prompts: int, seed: int, log=print) -> Figures:
    rng = random.Random(seed)
    longs = [[2] + [rng.randrange(8, vocab) for _ in range(length - 1)] for _ in range(prompts)]
    model.set_attn_implementation("sdpa")
    sdpa = [first_token_logprobs(model, p) for p in longs]
    model.set_attn_implementation("eager")
    eager = [first_token_logprobs(model, p) for p in longs]
    eager_vs_sdpa = max(top10_diff(a, b) for a, b in zip(eager, sdpa))
    log(f"  eager vs sdpa at {length} tokens: {eager_vs_sdpa:.2e} (top-1 margins "
        f"{', '.join(f'{margin(e):.3f}' for e in eager)})")
    effects = []
    layers = model.model.layers
    for i, layer in enumerate(layers):
        w = layer.self_attn.o_proj.weight
        saved = w.detach().clone()
        with torch.no_grad():
            w.zero_()
        try:
            moved = max(top10_diff(e, first_token_logprobs(model, p)) for e, p in zip(eager, longs))
        finally:
            with torch.no_grad():
                w.copy_(saved)
        effects.append(moved)
        log(f"  layer {i} o_proj zeroed: top-10 logprobs move {moved:.3e}")
    model.set_attn_implementation("sdpa")
    margins, repeats = [], 0
    for k in range(margin_prompts):
        n = rng.choice([8, 32, 128, 600, 1024]) if length >= 1024 else rng.randint(8, length)
        ids = [2] + [rng.randrange(8, vocab) for _ in range(n - 1)]
        lp = first_token_logprobs(model, ids)
        margins.append(margin(lp))
        repeats += int(lp.argmax()) in ids
    log(f"  top-1 margins {', '.join(f'{m:.3f}' for m in margins)}; the top-1 token is in the prompt on {repeats} "
        f"of {margin_prompts}")
    weakest = min(range(len(effects)), key=effects.__getitem__)
    margins.sort()
    return Figures(eager_vs_sdpa, effects[weakest], weakest, sum(m > 0.1 for m in margins) / len(margins),
                   margins[len(margins) // 2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.conditioning", description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="e2b-full-wc", help="a streamed full-size recipe of impl.checkpoint_factory.checkpoints")
    ap.add_argument("--layers", type=int, default=7, help="layers of the reduced copy (default 7; 0: all)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary of the reduced copy (default: the recipe's)")
    ap.add_argument("--length", type=int, default=1024, help="prompt tokens of figures 1 and 2")
    ap.add_argument("--prompts", type=int, default=2, help="prompts of figures 1 and 2")
    ap.add_argument("--margin-prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one of the recipe's init scales (impl/checkpoint_factory/well_conditioned.py DEFAULTS)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = TINY_CHECKPOINTS[args.recipe]
    if args.set:
        init = dict(recipe.init)
        init.update({k: float(v) for k, v in (s.split("=", 1) for s in args.set)})
        recipe = dataclasses.replace(recipe, init=init)
    recipe = reduced(recipe, args.layers or None, args.vocab)
    text = recipe.text_config
    print(f"{args.recipe}: {text['num_hidden_layers']} layers ({text.get('num_kv_shared_layers', 0)} KV-shared), "
          f"hidden {text['hidden_size']}, vocabulary {text['vocab_size']}, init {dict(recipe.init) or 'default'}",
          flush=True)
    t0 = time.perf_counter()
    model = build_model(recipe)
    print(f"  built in {time.perf_counter() - t0:.0f} s", flush=True)
    f = measure(model, int(text["vocab_size"]), args.length, args.prompts, args.margin_prompts, args.seed)
    print(f"1. eager vs sdpa, first-token top-10 logprobs at {args.length} tokens: max abs diff {f.eager_vs_sdpa:.2e} "
          f"({'meets' if f.eager_vs_sdpa <= 1e-4 else 'misses'} <= 1e-4)")
    print(f"2. every layer matters: the weakest (layer {f.weakest_layer}) moves them by {f.min_layer_effect:.2e} "
          f"({'meets' if f.min_layer_effect >= 1e-2 else 'misses'} >= 1e-2)")
    print(f"3. top-1 margin > 0.1 on {f.margin_fraction:.0%} of {args.margin_prompts} prompts (median margin "
          f"{f.median_margin:.3f}; {'meets' if f.margin_fraction > 0.5 else 'misses'} 'most')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
