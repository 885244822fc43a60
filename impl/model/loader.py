"""Load a Gemma-4 HF checkpoint folder into our model.

Reads ``config.json`` through ModelConfig, then one ``model.safetensors`` or
the shards named by ``model.safetensors.index.json``, tensor by tensor straight into the parameters
(``safetensors_io``); ``WeightPlan`` says beforehand which dtype each weight gets and which tables are
memory-mapped, so the engine can refuse a model that does not fit before reading it. Text weights are named
``model.*`` (gemma4_text) or ``model.language_model.*`` (multimodal gemma4);
vision/audio weights are skipped. Not stored and not expected: ``lm_head``
(tied), k/v projections and k_norm of KV-shared layers (ignored if present),
``v_proj`` of k_eq_v full layers, ``v_norm`` weights.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn

from impl.config.model_config import ModelConfig
from impl.envs import envs
from impl.model.safetensors_io import FileRows, TensorEntry, map_tensor, mappable, read_ahead, read_index, read_into
from impl.quant.base import QuantScheme
from impl.quant.loading import QuantTargets, TargetLoader, install_reference_forwards, plan_targets, quantize_lm_head

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


# Tables read only by row gathers (and the tied LM head) that a wider --dtype never widens; the ones in
# MAPPED_TABLES are served zero-copy from the checkpoint file on CPU (see WeightPlan).
EMBEDDING_TABLES = ("embed_tokens.weight", "embed_tokens_per_layer.weight")
MAPPED_TABLES = ("embed_tokens_per_layer.weight",)
MMAP_ENV = envs.IMPL_MMAP_EMBEDDINGS.name  # "0": load the mapped tables into memory instead


@dataclass(frozen=True)
class WeightPlan:
    """Where every weight of a checkpoint goes, known before anything is read (so a model that does not
    fit is refused first).

    Every parameter gets the model dtype, except the embedding tables (``EMBEDDING_TABLES``): a table
    keeps the checkpoint's dtype when --dtype is wider (float32 over a bf16 checkpoint: 2.75 B of E2B's
    4.63 B parameters would double for nothing, they are only gathered and, tied, read by the LM head
    that ``compute_logits`` runs in the model dtype) and follows a narrower --dtype like every weight.
    On CPU the per-layer-embedding table (``MAPPED_TABLES``; E2B: 262144 x 8960, 4.7 GB in bf16) is not
    loaded at all but memory-mapped from the safetensors file when its dtype matches: it is read only by
    row gathers (a token touches 17.5 KB of it), so it costs page cache for the rows touched, which the
    kernel can drop under pressure, instead of 4.7 GB of anonymous memory. ``embed_tokens`` stays in
    memory where it is the LM head, read whole at every step; with quantized weights the LM head reads a
    packed copy (``impl/quant``), so ``embed_tokens`` is only gathered and is mapped too (E2B: 805 MB in bf16;
    the copy is packed from the file in blocks of rows). ``IMPL_MMAP_EMBEDDINGS=0`` loads both."""

    dtype: torch.dtype
    entries: tuple[TensorEntry, ...]
    param_dtypes: Mapping[str, torch.dtype]  # every parameter / buffer -> its dtype once loaded
    mapped: Mapping[str, TensorEntry]  # parameters served from a memory map
    resident_bytes: int  # memory the loaded weights take (anonymous)
    mapped_bytes: int  # bytes memory-mapped from the checkpoint files (page cache)
    quant: QuantTargets | None = None  # the linear weights stored quantized (impl/quant), counted packed

    def describe_tables(self) -> str:
        parts = []
        for name in EMBEDDING_TABLES:
            if name in self.param_dtypes:
                where = (f"memory-mapped from {os.path.basename(self.mapped[name].path)} (read ahead into the "
                         "page cache in the background)" if name in self.mapped else "in memory")
                parts.append(f"{name.split('.')[0]} {_dtype_name(self.param_dtypes[name])} {where}")
        return ", ".join(parts)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def model_class(config: ModelConfig):
    if config.is_assistant:
        from impl.model.assistant import Gemma4AssistantForCausalLM

        return Gemma4AssistantForCausalLM
    if config.is_gemma4:
        from impl.model.gemma4 import Gemma4ForCausalLM

        return Gemma4ForCausalLM
    raise ValueError(f"{config.model_path!r} is a {config.model_type!r} model; this engine serves Gemma-4 (gemma4, gemma4_text).")


def _head_copied(config: ModelConfig, quant: QuantScheme | None) -> bool:
    """True when the LM head reads a packed copy of the tied embedding (impl/quant): the embedding is then
    only gathered, and is mapped like the per-layer-embedding table."""
    head = quant.lm_head if quant is not None else None
    return head is not None and config.tie_word_embeddings and head.applies_to(config.hidden_size)


def plan_weights(model_path: str, config: ModelConfig, dtype: torch.dtype, device: str | torch.device = "cpu",
                 model=None, quant: QuantScheme | None = None) -> WeightPlan:
    """The WeightPlan of ``model_path`` loaded as ``dtype`` on ``device`` (reads only the file headers);
    ``quant``: its linear weights stored in that quantized format."""
    entries = read_index(checkpoint_files(model_path))
    if model is None:
        model = model_class(config)(config, dtype=dtype, device="meta")
    targets = plan_targets(model, quant, config.quantization_config) if quant is not None else None
    tables = EMBEDDING_TABLES if config.is_gemma4 else ()
    by_param = {text_name(e.name, config.model_type == "gemma4"): e for e in entries}
    mmap_on = torch.device(device).type == "cpu" and envs.IMPL_MMAP_EMBEDDINGS.get()
    maps = MAPPED_TABLES + (("embed_tokens.weight",) if _head_copied(config, quant) else ())
    dtypes: dict[str, torch.dtype] = {}
    mapped: dict[str, TensorEntry] = {}
    resident = mapped_bytes = 0
    for name, t in _tensors(model):
        final = t.dtype
        entry = by_param.get(name)
        if name in tables and entry is not None and entry.dtype.is_floating_point:
            wider = torch.empty((), dtype=final).element_size() > torch.empty((), dtype=entry.dtype).element_size()
            final = entry.dtype if wider else final
            if mmap_on and name in maps and final == entry.dtype and mappable(entry):
                mapped[name] = entry
        dtypes[name] = final
        nbytes = t.numel() * torch.empty((), dtype=final).element_size()
        if targets is not None and name in targets.shapes:
            nbytes = targets.packed_bytes(name)
        if name in mapped:
            mapped_bytes += nbytes
        else:
            resident += nbytes
    if targets is not None and targets.scheme.lm_head is not None and config.tie_word_embeddings:
        n, k = config.vocab_size, config.hidden_size
        resident += targets.scheme.lm_head.packed_bytes(n, k) if targets.scheme.lm_head.applies_to(k) else 0
    return WeightPlan(dtype, tuple(entries), dtypes, mapped, resident, mapped_bytes, targets)


def _tensors(model):
    yield from model.named_parameters()
    yield from model.named_buffers()


def materialize(model, plan: WeightPlan, device: str | torch.device) -> None:
    """Give every meta parameter / buffer its (uninitialised) storage in its planned dtype; mapped tables
    get none (``load_weights`` installs their maps)."""
    for mod_name, mod in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for pname, p in list(mod._parameters.items()):
            if p is None or f"{prefix}{pname}" in plan.mapped or plan.quant is not None and f"{prefix}{pname}" in plan.quant.shapes:
                continue  # quantized weights get their packed tensor when they are read
            mod._parameters[pname] = nn.Parameter(
                torch.empty(p.shape, dtype=plan.param_dtypes[f"{prefix}{pname}"], device=device), requires_grad=False)
        for bname, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[bname] = torch.empty(b.shape, dtype=plan.param_dtypes[f"{prefix}{bname}"], device=device)


def load_model(model_path: str, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu", config: ModelConfig | None = None,
               plan: WeightPlan | None = None, quant: QuantScheme | None = None):
    """Build the model for ``model_path`` and load its weights, tensor by tensor straight into their
    parameters (``safetensors_io``: no second copy), placed as ``plan`` (``plan_weights``) says. The model
    runs the model files' own forwards; on CPU the engine then applies
    ``impl/kernels/cpu_fused/transform.py`` (``ModelRunner``)."""
    config = config or ModelConfig.from_pretrained(model_path)
    torch_dtype = resolve_dtype(dtype, config)
    model = model_class(config)(config, dtype=torch_dtype, device="meta")
    plan = plan or plan_weights(model_path, config, torch_dtype, device, model=model, quant=quant)
    materialize(model, plan, device)
    load_weights(model, plan, config)
    if plan.quant is not None:
        install_reference_forwards(model, plan.quant)
        head = plan.quant.scheme.lm_head
        if head is not None and config.tie_word_embeddings and quantize_lm_head(model, head) is None:
            logger.info("the LM head keeps its float weights (its width does not take %s)", head.name())
        logger.info("quantized weights: %s", plan.quant.describe())
    model.weight_plan = plan
    logger.info(
        "loaded %s (%s, %d layers, %d KV-shared) from %s as %s on %s",
        type(model).__name__, config.model_type, config.num_hidden_layers, config.num_kv_shared_layers,
        model_path, _dtype_name(torch_dtype), device,
    )
    if plan.describe_tables():
        logger.info("embedding tables: %s", plan.describe_tables())
    return model.eval()


def load_weights(model, plan: WeightPlan, config: ModelConfig) -> None:
    """Read the checkpoint's tensors into ``model``'s parameters (or install their memory maps); every
    parameter must be filled exactly once."""
    owners = {}
    for mod_name, mod in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for pname in list(mod._parameters) + list(mod._buffers):
            owners[f"{prefix}{pname}"] = (mod, pname)
    expected = set(plan.param_dtypes)
    loaded: set[str] = set()
    skipped = 0
    multimodal = config.model_type == "gemma4"

    def install(name: str, packed: torch.Tensor) -> None:
        mod, attr = owners[name]
        mod._parameters[attr] = nn.Parameter(packed, requires_grad=False)
        loaded.add(name)

    quant = TargetLoader(plan.quant, install) if plan.quant is not None else None
    for entry in plan.entries:
        name = text_name(entry.name, multimodal)
        if name is None:
            skipped += 1
            continue
        if quant is not None and quant.claims(name):
            quant.take(name, functools.partial(read_into, entry), entry.shape, entry.dtype)
            continue
        if name not in owners or name not in expected:
            if _ignorable(name, config):
                continue
            raise ValueError(
                f"checkpoint tensor {entry.name!r} (shape {entry.shape}) has no place in the model; "
                "the checkpoint does not match config.json."
            )
        mod, attr = owners[name]
        current = getattr(mod, attr)
        if tuple(current.shape) != entry.shape:
            raise ValueError(
                f"checkpoint tensor {entry.name!r} has shape {entry.shape}, expected {tuple(current.shape)} from config.json."
            )
        if name in loaded:
            raise ValueError(f"checkpoint tensor {entry.name!r} fills {name!r}, which another tensor already filled")
        if name in plan.mapped:
            mod._parameters[attr] = nn.Parameter(map_tensor(entry), requires_grad=False)
            mod.file_rows = FileRows(entry)  # the gathers' path: copies rows out of the page cache, maps nothing
            read_ahead(entry)  # into the page cache in the background: no disk read per cold row later
        else:
            read_into(entry, current.data)
        loaded.add(name)
    if quant is not None and quant.missing():
        raise ValueError(f"the checkpoint does not complete {len(quant.missing())} quantized weight(s), e.g. "
                         f"{quant.missing()[0]!r} (its parts are missing or do not match config.json's quantization_config)")
    missing = sorted(expected - loaded)
    if missing:
        shapes = ", ".join(f"{n} (expected shape {tuple(getattr(*owners[n]).shape)})" for n in missing[:5])
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
