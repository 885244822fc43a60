"""Streamed checkpoint writer: full-size seeded random Gemma-4 checkpoints without the model in memory.

``write_streamed(recipe, out_dir)`` writes what ``save_pretrained`` would (config.json, sharded
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``, tokenizer and generation
files) but never builds the model's weights: tensor names and shapes come from transformers' model
class instantiated on the ``meta`` device, and each tensor's values are generated in row blocks of at
most ``BLOCK_ELEMENTS`` (float32 draws, rounded to the stored dtype) and appended to its shard file.
Peak memory is one block (~64 MB), whatever the model size; the 9.3 GB ``e2b-full`` takes a few
minutes on one core, most of it the random draws.

Values are a pure function of (recipe seed, tensor name): each tensor has its own generator, seeded
from a hash of both. The text weights of the multimodal layout (``model.language_model.X``) are drawn
from the text layout's name (``model.X``), so ``e2b-full-mm`` holds exactly ``e2b-full``'s weights.
Distributions are ``checkpoints.init_rule``'s (the tiny factory's re-initialisation), plus the clip
bounds of the audio tower's clippable linears (-inf / +inf, transformers' own init).

Cache key (``checkpoints.recipe_hash``): the recipe, ``FORMAT_VERSION`` and the transformers version,
NOT this module's source: an edit here (or to ``init_rule`` / the tokenizer factory) must not silently
rebuild 9 GB checkpoints on every machine. What keeps the key honest instead is
``tests/test_full_size.py``: it builds the small streamed recipe ``e2b-mm`` and compares the files'
digest with ``GOLDEN_DIGEST``; a change to what this writer produces fails that test until
``FORMAT_VERSION`` is bumped and the digest updated, and the bump gives every streamed recipe a new
folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

FORMAT_VERSION = 1
# sha256 over the sorted (file name, file sha256) pairs of ``e2b-mm`` as this writer builds it
# (tests/test_full_size.py); update together with FORMAT_VERSION.
GOLDEN_DIGEST = "31b9dc73db4c1f29db41d7dff3bac9a2a914436d8b5fd6ec0f1a438fd5566afd"

BLOCK_ELEMENTS = 16 * 1024 * 1024  # draws per block (64 MB of float32)
SHARD_BYTES = 2 * 1024**3  # a shard closes once it reaches this size (a larger tensor gets one of its own)
_ST_DTYPES = {"bfloat16": "BF16", "float32": "F32", "float16": "F16"}
MM_TEXT_PREFIX = "model.language_model."


@dataclass(frozen=True)
class TensorSpec:
    name: str  # checkpoint name
    shape: tuple[int, ...]
    value_name: str  # the name its values are drawn from (text weights: the text layout's name)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def hf_config(recipe) -> Any:
    """The transformers config object of a streamed recipe (text, or multimodal with its towers)."""
    from transformers import Gemma4Config, Gemma4TextConfig

    text = Gemma4TextConfig(**dict(recipe.text_config))
    if not recipe.towers:
        text.architectures = ["Gemma4ForCausalLM"]
        text.dtype = recipe.dtype
        return text
    cfg = Gemma4Config(text_config=text.to_dict(), vision_config=dict(recipe.towers["vision"]),
                       audio_config=dict(recipe.towers["audio"]))
    cfg.architectures = ["Gemma4ForConditionalGeneration"]
    cfg.dtype = recipe.dtype
    assert isinstance(cfg.text_config, Gemma4TextConfig)  # built from the dict above
    cfg.text_config.dtype = recipe.dtype
    return cfg


def tensor_specs(recipe) -> list[TensorSpec]:
    """Every tensor ``save_pretrained`` writes for this recipe, in state-dict order: the model built on the
    meta device (no memory), tied weights left out as transformers does."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    cfg = hf_config(recipe)
    cls = Gemma4ForConditionalGeneration if recipe.towers else Gemma4ForCausalLM
    with torch.device("meta"):
        model = cls(cfg)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if getattr(cfg, "tie_word_embeddings", True) else set()
    out = []
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        value_name = "model." + name[len(MM_TEXT_PREFIX):] if name.startswith(MM_TEXT_PREFIX) else name
        out.append(TensorSpec(name, tuple(int(s) for s in t.shape), value_name))
    return out


def _seed_of(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def tensor_blocks(spec: TensorSpec, seed: int, dtype, init: Mapping[str, float] | None = None) -> Iterator[bytes]:
    """The tensor's values in ``dtype``, as raw little-endian bytes, block by block (row-major). ``init`` (a
    streamed recipe's ``CheckpointRecipe.init``, non-empty): the well-conditioned rules
    (``impl/checkpoint_factory/well_conditioned.py``) with those scales."""
    import torch

    for block in tensor_values(spec, seed, init):
        yield block.to(dtype).view(torch.uint8).numpy().tobytes()


def tensor_values(spec: TensorSpec, seed: int, init: Mapping[str, float] | None = None) -> Iterator["Any"]:
    """The tensor's float32 values, flat and row-major, block by block (``tensor_blocks`` before rounding)."""
    import torch

    from impl.checkpoint_factory.checkpoints import draw, init_rule

    leaf = spec.value_name.rsplit(".", 1)[-1]
    if leaf.endswith("_min") or leaf.endswith("_max"):  # clippable-linear bounds: transformers' init (no clipping)
        value = float("-inf") if leaf.endswith("_min") else float("inf")
        yield torch.full(spec.shape, value, dtype=torch.float32).reshape(-1)
        return
    g = torch.Generator().manual_seed(_seed_of(seed, spec.value_name))
    if init:
        from impl.checkpoint_factory import well_conditioned

        yield from well_conditioned.blocks(well_conditioned.init_rule(spec.value_name, spec.shape, init), spec.shape,
                                           g, BLOCK_ELEMENTS)
        return
    rule = init_rule(spec.value_name, spec.shape)
    left = spec.numel
    while left:
        n = min(left, BLOCK_ELEMENTS)
        yield draw(rule, (n,), g)
        left -= n


def _header(specs: list[TensorSpec], st_dtype: str, elsize: int) -> bytes:
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for s in specs:
        entries[s.name] = {"dtype": st_dtype, "shape": list(s.shape), "data_offsets": [off, off + s.numel * elsize]}
        off += s.numel * elsize
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned (safetensors pads its header the same way)
    return struct.pack("<Q", len(raw)) + raw


def shard_plan(specs: list[TensorSpec], elsize: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        nbytes = s.numel * elsize
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += nbytes
    return shards


def total_bytes(recipe) -> int:
    import torch

    elsize = torch.empty((), dtype=_torch_dtype(recipe.dtype)).element_size()
    return sum(s.numel for s in tensor_specs(recipe)) * elsize


def check_room(recipe, out_dir: str) -> None:
    """Refuse (ValueError) before writing anything when the disk cannot hold the checkpoint."""
    import shutil

    need = total_bytes(recipe) + 64 * 1024**2  # + tokenizer and json files
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise ValueError(f"building this checkpoint needs {need} bytes ({need / 2**30:.1f} GiB) of disk in {out_dir}, "
                         f"{free} bytes ({free / 2**30:.1f} GiB) are free; free some space or set YOCO_CACHE_DIR "
                         "to a larger disk")


def write_streamed(recipe, out_dir: str, seed: int | None = None, log=None) -> None:
    """Write the streamed recipe ``recipe`` into the existing folder ``out_dir``."""
    import torch

    from impl.checkpoint_factory.checkpoints import rewrite_published_config_form
    from impl.checkpoint_factory.tokenizer_factory import write_tokenizer_files

    seed = recipe.seed if seed is None else seed
    dtype = _torch_dtype(recipe.dtype)
    st_dtype, elsize = _ST_DTYPES[recipe.dtype], torch.empty((), dtype=dtype).element_size()
    specs = tensor_specs(recipe)
    shards = shard_plan(specs, elsize)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(_header(shard, st_dtype, elsize))
            for s in shard:
                for block in tensor_blocks(s, seed, dtype, recipe.init):
                    f.write(block)
                weight_map[s.name] = fname
                total += s.numel * elsize
        if log is not None:
            log(f"wrote {fname} ({sum(s.numel for s in shard) * elsize / 2**30:.2f} GiB, {len(shard)} tensors)")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_json(os.path.join(out_dir, "model.safetensors.index.json"), index)
    cfg = hf_config(recipe)
    cfg.save_pretrained(out_dir)
    if recipe.published_config_form:
        rewrite_published_config_form(os.path.join(out_dir, "config.json"), recipe.text_config)
    _scrub_version(os.path.join(out_dir, "config.json"))
    max_len, vocab = int(recipe.text_config["max_position_embeddings"]), int(recipe.text_config["vocab_size"])
    if recipe.tokenizer == "gemma":
        from impl.checkpoint_factory.gemma_tokenizer import write_gemma_tokenizer_files

        write_gemma_tokenizer_files(out_dir, model_max_length=max_len, vocab_size=vocab)
    else:
        write_tokenizer_files(out_dir, model_max_length=max_len, vocab_size=vocab)


def _scrub_version(config_path: str) -> None:
    """Sorted keys, and no transformers_version (the cache key holds it; files stay comparable)."""
    with open(config_path) as f:
        cfg = json.load(f)
    cfg.pop("transformers_version", None)
    _write_json(config_path, cfg)


def _write_json(path: str, obj: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
