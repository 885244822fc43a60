"""Load a Gemma-4 HF checkpoint folder into our model.

Reads ``config.json`` through ModelConfig, then one ``model.safetensors`` or
the shards named by ``model.safetensors.index.json``. Text weights are named
``model.*`` (gemma4_text) or ``model.language_model.*`` (multimodal gemma4);
vision/audio weights are skipped. Not stored and not expected: ``lm_head``
(tied), k/v projections and k_norm of KV-shared layers (ignored if present),
``v_proj`` of k_eq_v full layers, ``v_norm`` weights.
"""

from __future__ import annotations

import json
import logging
import os
import re

import torch
from safetensors import safe_open

from impl.config.model_config import ModelConfig

logger = logging.getLogger("impl.model")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SHARED_KV_NAMES = re.compile(r"^layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


def resolve_dtype(dtype: str | torch.dtype, config: ModelConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dtype = config.torch_dtype if config.torch_dtype in DTYPES else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)} or 'auto'.")
    return DTYPES[dtype]


def checkpoint_files(model_path: str) -> list[str]:
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(model_path, s))]
        if missing:
            raise ValueError(f"{index} names shard files that are missing: {missing}")
        return [os.path.join(model_path, s) for s in shards]
    single = os.path.join(model_path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise ValueError(f"{model_path!r} holds no model.safetensors or model.safetensors.index.json; is it an HF checkpoint folder?")


def text_name(name: str, is_multimodal: bool) -> str | None:
    """Checkpoint name -> our parameter name, or None for a non-text (vision/audio) tensor to skip.

    gemma4_text / assistant: ``model.X`` -> ``X``; other names (``lm_head.weight``, the
    assistant's ``pre_projection.weight``) are kept as they are. Multimodal gemma4:
    ``model.language_model.X`` -> ``X``, ``lm_head.weight`` kept, everything else skipped.
    """
    if name == "lm_head.weight":
        return name
    if is_multimodal:
        prefix = "model.language_model."
        return name[len(prefix) :] if name.startswith(prefix) else None
    return name[len("model.") :] if name.startswith("model.") else name


def iter_checkpoint(model_path: str):
    """Yields (name, tensor) over all shards."""
    for path in checkpoint_files(model_path):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(model_path: str, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu", config: ModelConfig | None = None):
    """Build the model for ``model_path`` and load its weights. The model runs the model files' own
    forwards; on CPU the engine then applies ``impl/kernels/cpu_fused/transform.py`` (``ModelRunner``)."""
    config = config or ModelConfig.from_pretrained(model_path)
    torch_dtype = resolve_dtype(dtype, config)
    if config.is_assistant:
        from impl.model.assistant import Gemma4AssistantForCausalLM as cls
    elif config.is_gemma4:
        from impl.model.gemma4 import Gemma4ForCausalLM as cls
    else:
        raise ValueError(f"{model_path!r} is a {config.model_type!r} model; this engine serves Gemma-4 (gemma4, gemma4_text).")
    model = cls(config, dtype=torch_dtype, device="meta")
    model.to_empty(device=device)
    load_weights(model, iter_checkpoint(model_path), config)
    logger.info(
        "loaded %s (%s, %d layers, %d KV-shared) from %s as %s on %s",
        type(model).__name__, config.model_type, config.num_hidden_layers, config.num_kv_shared_layers,
        model_path, str(torch_dtype).replace("torch.", ""), device,
    )
    return model.eval()


def load_weights(model, weights, config: ModelConfig) -> None:
    """Copy checkpoint tensors into ``model``'s parameters; every parameter must be filled exactly once."""
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    expected = set(params)
    loaded: set[str] = set()
    skipped = 0
    multimodal = config.model_type == "gemma4"
    for ckpt_name, tensor in weights:
        name = text_name(ckpt_name, multimodal)
        if name is None:
            skipped += 1
            continue
        if name not in params:
            if _ignorable(name, config):
                continue
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} (shape {tuple(tensor.shape)}) has no place in the model; "
                "the checkpoint does not match config.json."
            )
        p = params[name]
        if tuple(p.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}, expected {tuple(p.shape)} from config.json."
            )
        with torch.no_grad():
            p.copy_(tensor.to(p.dtype))
        loaded.add(name)
    missing = sorted(expected - loaded)
    if missing:
        shapes = ", ".join(f"{n} (expected shape {tuple(params[n].shape)})" for n in missing[:5])
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s): {shapes}" + (" ..." if len(missing) > 5 else ""))
    if skipped:
        logger.info("skipped %d non-text (vision/audio) tensors", skipped)


def _ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors a checkpoint may hold that the model legitimately has no place for."""
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return True
    if name.endswith("v_norm.weight"):
        return True
    m = _SHARED_KV_NAMES.match(name)
    return bool(m and config.is_kv_shared(int(m.group(1))))
