"""Reduced copies of a streamed full-size recipe: the same widths, init and tokenizer on fewer layers (and
optionally a smaller vocabulary), to try a full-size check (``bench/conditioning.py``, ``bench/parity_full.py``)
before paying for the full model.

``reduced(recipe, layers, vocab)`` cuts the recipe's layer types (the E2B pattern ``[s x4, f] x7``) to ``layers``,
the last one full attention as Gemma-4 requires (7: ``[s x4, f, s, f]``), the last two KV-shared from 7 layers
on (producers: layers 3 and 4); ``reduced_checkpoint(name, layers, vocab)``
writes it with the streamed writer under the checkpoint cache, once (``<name>-<layers>l[-v<vocab>]-<hash>``).
Tensor values are drawn per tensor name, so a reduced copy's layers hold the full checkpoint's values wherever
the shapes agree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile

from impl.checkpoint_factory.checkpoints import TINY_CHECKPOINTS, CheckpointRecipe, _file_lock, cache_root, recipe_hash


def reduced(recipe: CheckpointRecipe, layers: int | None, vocab: int | None = None) -> CheckpointRecipe:
    """``recipe`` on its first ``layers`` layer types (all: None) and a vocabulary of ``vocab`` (the recipe's: None)."""
    text = dict(recipe.text_config)
    if layers is not None:
        if layers < 5:
            raise ValueError(f"a reduced copy has at least 5 layers (one full-attention layer), not {layers}")
        # the last layer is a full-attention one (transformers forces it; the config says so for every reader)
        types = list(text["layer_types"])[:layers - 1] + ["full_attention"]
        text.update(layer_types=types, num_hidden_layers=layers)
        if text.get("num_kv_shared_layers"):
            text["num_kv_shared_layers"] = 2 if layers >= 7 else 0  # [s x4, f, s, f]: producers 3 and 4
    if vocab is not None:
        text["vocab_size"] = vocab
        if text.get("vocab_size_per_layer_input"):
            text["vocab_size_per_layer_input"] = vocab
    return dataclasses.replace(recipe, text_config=text)


def reduced_checkpoint(name: str, layers: int | None, vocab: int | None = None, log=None) -> str:
    """The folder of recipe ``name`` reduced to ``layers`` / ``vocab`` (the full recipe when both are None),
    written on first use."""
    from impl.checkpoint_factory import full_size
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    if layers is None and vocab is None:
        return tiny_checkpoint(name)
    recipe = reduced(TINY_CHECKPOINTS[name], layers, vocab)
    key = hashlib.sha256(json.dumps({"base": recipe_hash(name), "layers": layers, "vocab": vocab},
                                    sort_keys=True).encode()).hexdigest()[:12]
    suffix = f"-{layers}l" + (f"-v{vocab}" if vocab else "")
    final = os.path.join(cache_root(), "checkpoints", f"{name}{suffix}-{key}")
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    with _file_lock(os.path.join(parent, f".{os.path.basename(final)}.lock")):
        if os.path.isdir(final):
            return final
        tmp = tempfile.mkdtemp(prefix=f".tmp-{name}{suffix}-", dir=parent)
        try:
            full_size.check_room(recipe, tmp)
            full_size.write_streamed(recipe, tmp, log=log)
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
