"""The model a server serves without ``--model-path``: the embedded tiny Gemma-4.

A tiny E2B-shaped Gemma-4 (KV-shared layers, per-layer inputs, sliding and full
attention) with seeded random weights: its answers are gibberish, but every code
path is real, so a fresh clone serves at once. It is built on first use and cached
under ``$YOCO_CACHE_DIR/checkpoints`` (``.cache/checkpoints`` by default). The
launcher and the engine read the default here; the factory that writes it
(``impl.checkpoint_factory.checkpoints``, which writes the test checkpoints too) is
loaded only when the model is first needed.
"""

from __future__ import annotations

DEFAULT_MODEL = "e2b"


def default_model_path() -> str:
    """The embedded default model's folder, built (once, atomically) if missing."""
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    return tiny_checkpoint(DEFAULT_MODEL)
