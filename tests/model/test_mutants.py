"""The parity check fails for the modelling mistakes the spec names (each is one monkeypatch)."""

from __future__ import annotations

import pytest

from impl.config.model_config import ModelConfig, RopeSpec
from impl.model import ple, rope
from impl.model.loader import load_model
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.model import hf_logits, prompt, tolerance
from tests.helpers.session import Session


def _first_producer(self):
    """Mutant: a shared layer reads the FIRST non-shared layer of its type, not the last."""
    first = self.first_kv_shared_layer
    return tuple(
        i if i < first else next(j for j in range(first) if self.layer_types[j] == t) for i, t in enumerate(self.layer_types)
    )


_real_inv_freq = rope.rope_inv_freq


def _rope_all_dims(spec: RopeSpec, head_dim: int):
    """Mutant: proportional RoPE rotating every dim of full layers (partial_rotary_factor ignored)."""
    return _real_inv_freq(RopeSpec("default", spec.theta), head_dim)


MUTANTS = {
    "wrong_producer": (ModelConfig, "kv_producer", property(_first_producer)),
    "rope_on_all_dims": (rope, "rope_inv_freq", _rope_all_dims),
    "missing_ple_scale": (ple, "PER_LAYER_INPUT_SCALE", 1.0),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_parity_check_catches_mutant(mutant, monkeypatch):
    target, attr, value = MUTANTS[mutant]
    monkeypatch.setattr(target, attr, value)
    model = load_model(tiny_checkpoint("e2b"))  # built after patching: producers are read at construction
    toks = prompt(40, 5)
    out = Session(model).step([("a", toks)], all_logits=True)
    d = (out.logits.double() - hf_logits("e2b", toks)).abs().max().item()
    assert d > tolerance("e2b", [toks]), f"mutant {mutant} went unnoticed (diff {d:.3g})"
