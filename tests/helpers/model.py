"""Helpers shared by the model tests (and the cache, kernel, YOCO and args tests that build tiny models): our
model, the transformers reference, tolerances, a bfloat16 copy of a checkpoint, and the model-test fixtures
(a folder's conftest.py imports the fixtures it uses by name)."""

from __future__ import annotations

import functools
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from impl.model.loader import load_model
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

TEXT_CONFIGS = ["e2b", "k_eq_v", "moe", "noshare"]
SHARED_CONFIGS = ["e2b", "k_eq_v"]  # configs with KV-shared layers (YOCO applies)


@functools.lru_cache(maxsize=None)
def ours(name: str):
    return load_model(tiny_checkpoint(name), dtype="float32")


@functools.lru_cache(maxsize=None)
def hf_pair(name: str):
    """transformers Gemma4ForCausalLM on the same weights, in float32 and float64."""
    from transformers import Gemma4ForCausalLM

    path = tiny_checkpoint(name)
    hf32 = Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # the grouped-GEMM experts kernel has no float64 path; the eager one does
    hf64 = Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float64, experts_implementation="eager").eval()
    return hf32, hf64


def hf_logits(name: str, tokens: list[int], dtype=torch.float32) -> torch.Tensor:
    """[len(tokens), vocab] logits of transformers on one sequence (float64 copy of the result)."""
    return _hf_logits(name, tuple(tokens), dtype)


@functools.lru_cache(maxsize=256)
def _hf_logits(name: str, tokens: tuple[int, ...], dtype) -> torch.Tensor:
    hf32, hf64 = hf_pair(name)
    m = hf32 if dtype == torch.float32 else hf64
    with torch.no_grad():
        return m(torch.tensor([list(tokens)])).logits[0].to(torch.float64)


def tolerance(name: str, sequences: list[list[int]]) -> float:
    """max(10 x transformers' own float32-vs-float64 logit error on these inputs, 1e-4).

    Our forward and transformers' differ only in float32 rounding (operation order,
    packed vs padded attention); 10x the reference's own float32 error bounds that
    with margin while staying far below what a modelling bug produces (>= 1e-2 here).
    """
    err = max((hf_logits(name, s) - hf_logits(name, s, torch.float64)).abs().max().item() for s in sequences)
    return max(10 * err, 1e-4)


def prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def bf16_copy(tmp_path_factory, name: str = "e2b") -> str:
    """Checkpoint ``name`` stored in bfloat16 (config.json says so), as published checkpoints are."""
    src = tiny_checkpoint(name)
    dst = str(tmp_path_factory.mktemp("bf16") / name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["dtype"] = "bfloat16"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    return dst


@pytest.fixture(params=TEXT_CONFIGS)
def config_name(request) -> str:
    return request.param


@pytest.fixture(params=SHARED_CONFIGS)
def shared_config_name(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Tiny matrices: a second intra-op thread only adds synchronisation (ms per op on a busy 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
