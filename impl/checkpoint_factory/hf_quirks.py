"""Local work-arounds for transformers 5.23 quirks met while building references.

Nothing here edits site-packages; each patch is a context manager that restores
the original on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def assistant_kv_sharing_patch() -> Iterator[None]:
    """Let transformers build/load a Gemma-4 assistant (every layer KV-shared).

    ``Gemma4TextConfig.kv_sharing_modes`` raises when no layer produces K/V
    (the producer lookup finds no non-shared layer of each type). The assistant
    reads the target's K/V, so every layer is simply a "reuse" consumer. The
    property is only read while modules are constructed, so wrap model
    construction / ``from_pretrained`` in this context manager.
    """
    from transformers import Gemma4TextConfig

    original = Gemma4TextConfig.__dict__.get("kv_sharing_modes")
    if original is None:  # a transformers without the property (5.17 has none): nothing to work around
        yield
        return

    def kv_sharing_modes(self):
        if self.num_kv_shared_layers >= self.num_hidden_layers:
            return ["reuse"] * self.num_hidden_layers
        return original.fget(self)

    setattr(Gemma4TextConfig, "kv_sharing_modes", property(kv_sharing_modes))
    try:
        yield
    finally:
        setattr(Gemma4TextConfig, "kv_sharing_modes", original)
