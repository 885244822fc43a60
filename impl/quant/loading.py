"""Quantized weights while a checkpoint loads (``impl/model/loader.py`` calls these).

``plan_targets`` says before anything is read which parameters are quantized and their packed sizes (so the
memory check counts packed bytes); ``TargetLoader`` fills them tensor by tensor: a float weight is read into
a temporary of its own size and packed (``pack.py``: never more than one weight, and one chunk of it in
float32, at a time), a pre-quantized checkpoint's parts are collected and converted (``checkpoint.py``).
``finish`` builds the LM head's copy and gives every quantized ``nn.Linear`` a forward that reads its
packed weight (the torch reference; on CPU the fused kernels' transform replaces it).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from impl.envs import envs
from impl.quant import reference
from impl.quant.base import QuantScheme, WeightFormat
from impl.quant.checkpoint import SUFFIXES, Assembler, ignored
from impl.quant.pack import ROW_CHUNK, pack, pack_rows

logger = logging.getLogger("impl.model")

# Linear layers outside the decoder layers that are quantized too (the per-layer-input projection).
MODEL_LINEARS = ("per_layer_model_projection",)


@dataclass(frozen=True)
class QuantTargets:
    """The parameters a scheme quantizes: name -> (N, K), and the float weights it leaves (and why)."""

    scheme: QuantScheme
    shapes: Mapping[str, tuple[int, int]]
    kept: Mapping[str, str]  # parameter -> why it keeps its float dtype
    formats: Mapping[str, WeightFormat] = field(default_factory=dict)  # parameter -> its format where not scheme.fmt

    def format_of(self, name: str) -> WeightFormat:
        return self.formats.get(name, self.scheme.fmt)

    def packed_bytes(self, name: str) -> int:
        n, k = self.shapes[name]
        return self.format_of(name).packed_bytes(n, k)

    def describe(self) -> str:
        text = f"{self.scheme.describe()}: {len(self.shapes)} linear weights quantized"
        if self.kept:
            text += f", {len(self.kept)} kept in float ({'; '.join(sorted(set(self.kept.values())))})"
        return text


def _candidates(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    out: list[tuple[str, nn.Linear]] = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or m.bias is not None:
            continue
        if name.startswith("layers.") or name in MODEL_LINEARS:
            out.append((name, m))
    return out


def _kv_shared_layer(model: nn.Module, name: str) -> bool:
    """True when ``name`` lies in one of the model's KV-shared decoder layers (``layers.<i>.``,
    ``ModelConfig.is_kv_shared``)."""
    parts = name.split(".")
    config = getattr(model, "config", None)
    if config is None or len(parts) < 2 or parts[0] != "layers" or not parts[1].isdigit():
        return False
    return config.is_kv_shared(int(parts[1]))


def plan_targets(model: nn.Module, scheme: QuantScheme, quantization_config: Mapping[str, Any] | None) -> QuantTargets:
    shapes: dict[str, tuple[int, int]] = {}
    kept: dict[str, str] = {}
    formats: dict[str, WeightFormat] = {}
    keep = [p for p in (envs.IMPL_QUANT_KEEP.get() or "").split(",") if p]
    if keep and quantization_config is not None:
        raise ValueError(f"{envs.IMPL_QUANT_KEEP.name} chooses which layers stay float when quantizing while loading "
                         "(--torchao-config); this checkpoint is already quantized, and its quantization_config's ignore "
                         f"list says which layers are float. Unset {envs.IMPL_QUANT_KEEP.name}.")
    for name, m in _candidates(model):
        n, k = m.weight.shape
        fmt = scheme.kv_shared if scheme.kv_shared is not None and _kv_shared_layer(model, name) else scheme.fmt
        if quantization_config is not None and ignored(quantization_config, name):
            kept[f"{name}.weight"] = "in the checkpoint's ignore list"
        elif any(fnmatch.fnmatchcase(name, p) for p in keep):
            kept[f"{name}.weight"] = f"kept by {envs.IMPL_QUANT_KEEP.name}"
        elif not fmt.applies_to(k):
            kept[f"{name}.weight"] = f"{k} inputs do not split into groups of a multiple of 32"
        else:
            shapes[f"{name}.weight"] = (n, k)
            if fmt != scheme.fmt:
                formats[f"{name}.weight"] = fmt
    if scheme.kv_shared is not None and not formats:
        raise ValueError(f"--torchao-config-kv-shared gives the KV-shared layers {scheme.kv_shared.name()}, but no linear "
                         "weight of this model lies in one (it has no KV-shared layers, or their weights are all kept "
                         "float); unset it.")
    return QuantTargets(scheme, shapes, kept, formats)


@dataclass
class TargetLoader:
    """Fills the quantized parameters while ``load_weights`` walks the checkpoint's tensors."""

    targets: QuantTargets
    install: Callable[[str, torch.Tensor], None]  # parameter name -> packed tensor into the model
    assembler: Assembler | None = None
    done: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.targets.scheme.prequantized:
            self.assembler = Assembler(self.targets.scheme.fmt)

    def claims(self, name: str) -> bool:
        """True when checkpoint tensor ``name`` (our naming) belongs to a quantized parameter."""
        if name in self.targets.shapes:
            return True
        module, _, suffix = name.rpartition(".")
        return suffix in SUFFIXES and f"{module}.weight" in self.targets.shapes

    def take(self, name: str, read: Callable[[torch.Tensor], None], shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Read checkpoint tensor ``name`` (``read`` fills a tensor of ``shape`` / ``dtype``)."""
        tmp = torch.empty(shape, dtype=dtype)
        read(tmp)
        if self.assembler is None:
            if tuple(shape) != self.targets.shapes[name]:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(shape)}, expected {self.targets.shapes[name]}")
            self._install(name, pack(tmp, self.targets.format_of(name)))
            return
        module, _, suffix = name.rpartition(".")
        self.assembler.offer(module, suffix, tmp)
        if self.assembler.ready(module):
            n, k = self.targets.shapes[f"{module}.weight"]
            self._install(f"{module}.weight", self.assembler.build(module, n, k))

    def _install(self, name: str, packed: torch.Tensor) -> None:
        if name in self.done:
            raise ValueError(f"the checkpoint fills quantized weight {name!r} twice")
        self.install(name, packed)
        self.done.add(name)

    def missing(self) -> list[str]:
        return sorted(set(self.targets.shapes) - self.done)


class QuantLinearReference:
    """An ``nn.Linear``'s forward over its packed weight (read at call time: the transform may restack it),
    through the torch reference, in x's dtype."""

    def __init__(self, module: nn.Linear):
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = reference.linear(x2, self.module.weight)
        return y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)


def install_reference_forwards(model: nn.Module, targets: QuantTargets) -> None:
    for name in targets.shapes:
        mod: Any = model.get_submodule(name.rsplit(".", 1)[0])
        mod.forward = QuantLinearReference(mod)


def quantize_lm_head(model: nn.Module, fmt: WeightFormat) -> torch.Tensor | None:
    """A packed copy of the model's LM head (the tied embedding), installed as its ``project_to_vocab`` through
    the torch reference; None when the model has none or its width does not take ``fmt``."""
    head = getattr(model, "lm_head_weight", None)
    if not callable(head) or not hasattr(model, "project_to_vocab"):
        return None
    w = head()
    if w.dim() != 2 or not fmt.applies_to(w.shape[1]) or w.device.type != "cpu":
        return None
    rows = getattr(getattr(model, "embed_tokens", None), "file_rows", None)
    if rows is not None and tuple(w.shape) == (rows.num_rows, rows.cols):
        # a mapped embedding (loader.WeightPlan): packed from the file in blocks of rows, so no page of its
        # mapping becomes resident (reading the mapped tensor whole would put all of it in the RSS)
        packed = torch.empty(fmt.packed_shape(*w.shape), dtype=fmt.torch_dtype)
        for lo in range(0, rows.num_rows, ROW_CHUNK):
            hi = min(lo + ROW_CHUNK, rows.num_rows)
            packed[lo:hi] = pack_rows(rows.block(lo, hi), fmt)
    else:
        packed = pack(w, fmt)
    model.lm_head_quant = packed
    setattr(model, "project_to_vocab", lambda h: reference.linear(h.reshape(-1, h.shape[-1]), packed))  # the instance's own
    return packed


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every ``nn.Linear`` weight (packed or float; a stacked weight's
    storage once) and the LM head (its packed copy, or the embedding it is tied to). Copies the CPU transform
    made in place of parameters (oneDNN's prepacked float weights, W8A8 in tile order) are not parameters and
    are not counted here (the model runner adds the transform's)."""
    seen: dict[int, int] = {}
    for m in model.modules():
        if isinstance(m, nn.Linear) and not m.weight.is_meta:
            st = m.weight.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    packed = getattr(model, "lm_head_quant", None)
    head = getattr(model, "lm_head_weight", None)
    w = packed if packed is not None else head() if callable(head) else None
    if w is not None and not w.is_meta:
        seen[w.untyped_storage().data_ptr()] = w.numel() * w.element_size()
    return sum(seen.values())
