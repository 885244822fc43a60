"""Engine test helpers: engines on tiny checkpoints (cached per settings), transformers greedy references."""

from __future__ import annotations

import functools

import torch

from impl.checkpoint_factory.checkpoints import tiny_checkpoint

# Tiny models on a shared 2-core machine: intra-op threads only contend (one decode step
# is 10x slower with 2 threads under load). The lead may move this to the root conftest.
torch.set_num_threads(1)

TIE_GAP = 1e-3  # stop comparing greedy tokens where transformers' top-2 logits are closer than this


def prompts(n: int = 6, lengths=(1, 5, 17, 33, 9, 40), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[2] + torch.randint(3, 500, (length - 1,), generator=g).tolist() for length in lengths[:n]]


_ENGINES: dict = {}


def all_engines() -> list:
    return list(_ENGINES.values())


def engine(name: str = "e2b", **kw):
    """One Engine per (checkpoint, settings) for the whole session."""
    from impl import Engine

    key = (name, tuple(sorted(kw.items())))
    if key not in _ENGINES:
        _ENGINES[key] = Engine(tiny_checkpoint(name), dtype="float32", random_seed=0, **kw)
    return _ENGINES[key]


@functools.lru_cache(maxsize=None)
def hf_model(name: str):
    from transformers import Gemma4ForCausalLM

    return Gemma4ForCausalLM.from_pretrained(tiny_checkpoint(name), dtype=torch.float32).eval()


@functools.lru_cache(maxsize=None)
def hf_greedy(name: str, prompt: tuple[int, ...], max_new: int) -> tuple[list[int], list[float]]:
    """transformers greedy tokens and each step's top-2 logit gap (EOS never stops it)."""
    model = hf_model(name)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]), max_new_tokens=max_new, do_sample=False, eos_token_id=[],
            output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        )
    tokens = out.sequences[0, len(prompt):].tolist()
    gaps = []
    for step in out.logits:
        top2 = torch.topk(step[0].float(), 2).values
        gaps.append(float(top2[0] - top2[1]))
    return tokens, gaps


def assert_greedy_matches(name: str, prompt: list[int], ours: list[int], max_new: int) -> int:
    """Compare token by token up to the first near tie; returns how many tokens were compared."""
    ref, gaps = hf_greedy(name, tuple(prompt), max_new)
    assert len(ours) == len(ref), f"engine produced {len(ours)} tokens, transformers {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref)):
        if gaps[i] < TIE_GAP:
            return i
        assert a == b, f"prompt of {len(prompt)} tokens: token {i} differs (engine {a}, transformers {b}); ours={ours} ref={ref}"
    return len(ref)
