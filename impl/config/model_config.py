"""ModelConfig: the one adapter from an HF ``config.json`` to a frozen, typed record.

Nothing else in ``impl`` reads raw HF config dicts. Gemma-4 (``gemma4``,
``gemma4_text``, ``gemma4_assistant``) is fully described; a few other
architectures (llama, qwen2, mistral, deepseek) are recognised so that the
fast-prefill and KV-cache rules can reject them with a clear message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

GEMMA4_TYPES = ("gemma4", "gemma4_text")
ASSISTANT_TYPE = "gemma4_assistant"
OTHER_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gemma3", "deepseek_v3", "deepseek_v2")
MLA_TYPES = ("deepseek_v3", "deepseek_v2")
SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class RopeSpec:
    rope_type: str  # "default" | "proportional"
    theta: float
    partial_rotary_factor: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Everything the engine and the argument rules need to know about a model.

    Per-layer tuples have ``num_hidden_layers`` entries. ``kv_producer[i]`` is
    the layer whose K/V layer ``i`` reads: itself for a non-shared layer, the
    last non-shared layer of the same type for a KV-shared one (``None`` for an
    assistant, whose K/V come from the target model).
    """

    model_path: str
    model_type: str
    architectures: tuple[str, ...] = ()
    vocab_size: int = 0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0  # sliding layers (and all layers of non-Gemma models)
    global_head_dim: int = 0  # full-attention layers
    num_global_key_value_heads: int = 0
    layer_types: tuple[str, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    layer_num_kv_heads: tuple[int, ...] = ()
    sliding_window: int | None = None
    num_kv_shared_layers: int = 0
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    rope: Mapping[str, RopeSpec] = field(default_factory=dict)
    rms_norm_eps: float = 1e-6
    final_logit_softcapping: float | None = None
    attention_k_eq_v: bool = False
    use_double_wide_mlp: bool = False
    enable_moe_block: bool = False
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    hidden_activation: str = "gelu_pytorch_tanh"
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 131072
    bos_token_id: int | None = 2
    eos_token_ids: tuple[int, ...] = (1,)
    pad_token_id: int | None = 0
    torch_dtype: str | None = None
    # config.json's ``quantization_config`` (a pre-quantized checkpoint; impl/quant/checkpoint.py reads it)
    quantization_config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    # assistant (MTP draft) only
    backbone_hidden_size: int = 0
    use_ordered_embeddings: bool = False
    num_centroids: int = 0
    centroid_intermediate_top_k: int = 0
    # KV-cache rules (seed 004)
    is_mla: bool = False
    v_head_dim: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    # runtime switch plumbed from ServerArgs (seed 000, F4)
    kv_sharing_fast_prefill: bool = False

    # ---- derived facts -------------------------------------------------
    @property
    def is_gemma4(self) -> bool:
        return self.model_type in GEMMA4_TYPES

    @property
    def is_assistant(self) -> bool:
        return self.model_type == ASSISTANT_TYPE

    @property
    def is_hybrid_swa(self) -> bool:
        return SLIDING in self.layer_types and FULL in self.layer_types

    @property
    def first_kv_shared_layer(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    def is_kv_shared(self, layer_id: int) -> bool:
        return layer_id >= self.first_kv_shared_layer

    @property
    def kv_producer(self) -> tuple[int | None, ...]:
        first = self.first_kv_shared_layer
        out: list[int | None] = []
        for i, t in enumerate(self.layer_types):
            if i < first:
                out.append(i)
                continue
            producers = [j for j in range(first) if self.layer_types[j] == t]
            out.append(producers[-1] if producers else None)
        return tuple(out)

    @property
    def kv_layer_ids(self) -> tuple[int, ...]:
        """Layers that own a KV buffer (the non-shared ones)."""
        return tuple(range(self.first_kv_shared_layer))

    def is_sliding(self, layer_id: int) -> bool:
        return self.layer_types[layer_id] == SLIDING

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.model_path)) or self.model_path

    # ---- construction --------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_path: str, kv_sharing_fast_prefill: bool = False, dtype: str | None = None) -> "ModelConfig":
        path = os.path.join(model_path, "config.json")
        if not os.path.isfile(path):
            raise ValueError(
                f"--model-path {model_path!r} has no config.json; pass a folder holding an HF-format checkpoint "
                "(config.json, *.safetensors, tokenizer.json)."
            )
        with open(path) as f:
            raw = json.load(f)
        return cls.from_hf_dict(raw, model_path=model_path, kv_sharing_fast_prefill=kv_sharing_fast_prefill)

    @classmethod
    def from_server_args(cls, server_args: Any, model_path: str | None = None) -> "ModelConfig":
        return cls.from_pretrained(
            model_path or server_args.model_path,
            kv_sharing_fast_prefill=bool(getattr(server_args, "kv_sharing_fast_prefill", False)),
        )

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any], model_path: str = "", kv_sharing_fast_prefill: bool = False) -> "ModelConfig":
        model_type = raw.get("model_type", "")
        archs = tuple(raw.get("architectures") or ())
        if model_type == "gemma4":
            text = dict(raw.get("text_config") or {})
            text.setdefault("model_type", "gemma4_text")
            if not (text.get("dtype") or text.get("torch_dtype")):  # published configs may state it only at the top
                text["dtype"] = raw.get("dtype") or raw.get("torch_dtype")
            base = _gemma4_text_fields(text)
            base["model_type"] = "gemma4"
        elif model_type == "gemma4_text":
            base = _gemma4_text_fields(raw)
        elif model_type == ASSISTANT_TYPE:
            text = dict(raw.get("text_config") or {})
            base = _gemma4_text_fields(text, all_shared=True)
            base.update(
                model_type=ASSISTANT_TYPE,
                backbone_hidden_size=int(raw.get("backbone_hidden_size", 1536)),
                use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
                num_centroids=int(raw.get("num_centroids", 2048)),
                centroid_intermediate_top_k=int(raw.get("centroid_intermediate_top_k", 32)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            )
        elif model_type in OTHER_TYPES or model_type:
            base = _generic_fields(raw)
        else:
            raise ValueError(f"config.json in {model_path!r} has no model_type; is this an HF checkpoint folder?")
        qc = raw.get("quantization_config")
        if qc is None and isinstance(raw.get("text_config"), Mapping):
            qc = raw["text_config"].get("quantization_config")
        if qc is not None and not isinstance(qc, Mapping):
            raise ValueError(f"config.json in {model_path!r}: quantization_config must be an object, got {type(qc).__name__}.")
        return cls(model_path=model_path, architectures=archs, kv_sharing_fast_prefill=kv_sharing_fast_prefill,
                   quantization_config=qc, **base)

    def with_fast_prefill(self, on: bool) -> "ModelConfig":
        return replace(self, kv_sharing_fast_prefill=on)


def _eos_tuple(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v),)


def _gemma4_text_fields(c: Mapping[str, Any], all_shared: bool = False) -> dict[str, Any]:
    n = int(c.get("num_hidden_layers", 30))
    layer_types = list(c.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL for i in range(n)])
    layer_types[-1] = FULL  # transformers forces the last layer to full attention
    head_dim = int(c.get("head_dim", 256))
    kv_heads = int(c.get("num_key_value_heads", 4))
    k_eq_v = bool(c.get("attention_k_eq_v", False))
    # Published configs carry global_head_dim / num_global_key_value_heads; transformers'
    # save_pretrained writes a per_layer_config block instead. Read both.
    global_head_dim = int(c.get("global_head_dim", 512))
    g_kv = c.get("num_global_key_value_heads")
    global_kv_heads = int(g_kv) if (g_kv is not None and k_eq_v) else kv_heads
    # save_pretrained writes zero-padded string keys ("04"): index by int.
    per_layer = {int(k): v for k, v in (c.get("per_layer_config") or {}).items() if str(k).isdigit()}
    dims, heads = [], []
    for i, t in enumerate(layer_types):
        over = per_layer.get(i)
        if over is not None:
            dims.append(int(over.get("head_dim", head_dim)))
            heads.append(int(over.get("num_key_value_heads", kv_heads)))
        elif t == FULL:
            dims.append(global_head_dim)
            heads.append(global_kv_heads)
        else:
            dims.append(head_dim)
            heads.append(kv_heads)
    full_ids = [i for i, t in enumerate(layer_types) if t == FULL]
    if full_ids:
        global_head_dim, global_kv_heads = dims[full_ids[0]], heads[full_ids[0]]
    rp = c.get("rope_parameters") or {}
    rope = {
        SLIDING: _rope(rp.get(SLIDING), "default", 10_000.0, 1.0),
        FULL: _rope(rp.get(FULL), "proportional", 1_000_000.0, 0.25),
    }
    shared = n if all_shared else int(c.get("num_kv_shared_layers", 0) or 0)
    return dict(
        model_type=c.get("model_type", "gemma4_text"),
        vocab_size=int(c.get("vocab_size", 262_144)),
        hidden_size=int(c.get("hidden_size", 2304)),
        intermediate_size=int(c.get("intermediate_size", 9216)),
        num_hidden_layers=n,
        num_attention_heads=int(c.get("num_attention_heads", 8)),
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        global_head_dim=global_head_dim,
        num_global_key_value_heads=global_kv_heads,
        layer_types=tuple(layer_types),
        layer_head_dims=tuple(dims),
        layer_num_kv_heads=tuple(heads),
        sliding_window=int(c.get("sliding_window", 512)),
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=int(c.get("hidden_size_per_layer_input", 0) or 0),
        vocab_size_per_layer_input=int(c.get("vocab_size_per_layer_input", 0) or 0),
        rope=rope,
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        final_logit_softcapping=c.get("final_logit_softcapping"),
        attention_k_eq_v=k_eq_v,
        use_double_wide_mlp=bool(c.get("use_double_wide_mlp", False)),
        enable_moe_block=bool(c.get("enable_moe_block", False)),
        num_experts=int(c.get("num_experts") or 0),
        top_k_experts=int(c.get("top_k_experts") or 0),
        moe_intermediate_size=int(c.get("moe_intermediate_size") or 0),
        hidden_activation=c.get("hidden_activation", "gelu_pytorch_tanh"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        max_position_embeddings=int(c.get("max_position_embeddings", 131072)),
        bos_token_id=c.get("bos_token_id", 2),
        eos_token_ids=_eos_tuple(c.get("eos_token_id", 1)),
        pad_token_id=c.get("pad_token_id", 0),
        torch_dtype=c.get("dtype") or c.get("torch_dtype"),
        is_mla=False,
        v_head_dim=global_head_dim,
        swa_head_dim=head_dim,
        swa_v_head_dim=head_dim,
    )


def _rope(d: Mapping[str, Any] | None, rope_type: str, theta: float, prf: float) -> RopeSpec:
    d = d or {}
    return RopeSpec(
        rope_type=d.get("rope_type", rope_type),
        theta=float(d.get("rope_theta", theta)),
        partial_rotary_factor=float(d.get("partial_rotary_factor", prf if d.get("rope_type", rope_type) == "proportional" else 1.0)),
    )


def _generic_fields(c: Mapping[str, Any]) -> dict[str, Any]:
    """Enough of a non-Gemma-4 model for the argument rules (never served here)."""
    mt = c.get("model_type", "")
    n = int(c.get("num_hidden_layers", 1))
    heads = int(c.get("num_attention_heads", 1))
    hidden = int(c.get("hidden_size", 1))
    head_dim = int(c.get("head_dim") or hidden // max(heads, 1))
    is_mla = mt in MLA_TYPES
    # K and V row widths may differ (MLA; MiMo-V2's 192 / 128); sliding-window layers may have their own.
    v_head_dim = int(c.get("v_head_dim") or head_dim)
    if is_mla:
        head_dim = int(c.get("kv_lora_rank", 512)) + int(c.get("qk_rope_head_dim", 64))
    swa_head_dim = int(c.get("swa_head_dim") or head_dim)
    swa_v_head_dim = int(c.get("swa_v_head_dim") or v_head_dim)
    # Hybrid sliding-window configs list their layer types; otherwise every layer is full attention.
    layer_types = tuple(c.get("layer_types") or [FULL] * n)
    hybrid = SLIDING in layer_types
    sw = c.get("sliding_window") if (hybrid or c.get("use_sliding_window", mt == "mistral")) else None
    return dict(
        model_type=mt,
        vocab_size=int(c.get("vocab_size", 0)),
        hidden_size=hidden,
        intermediate_size=int(c.get("intermediate_size", 0)),
        num_hidden_layers=n,
        num_attention_heads=heads,
        num_key_value_heads=int(c.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        global_head_dim=head_dim,
        num_global_key_value_heads=int(c.get("num_key_value_heads", heads)),
        layer_types=layer_types,
        layer_head_dims=tuple(swa_head_dim if t == SLIDING else head_dim for t in layer_types),
        layer_num_kv_heads=tuple([int(c.get("num_key_value_heads", heads))] * n),
        sliding_window=sw,
        num_kv_shared_layers=0,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        eos_token_ids=_eos_tuple(c.get("eos_token_id")),
        bos_token_id=c.get("bos_token_id"),
        pad_token_id=c.get("pad_token_id"),
        is_mla=is_mla,
        v_head_dim=v_head_dim,
        swa_head_dim=swa_head_dim,
        swa_v_head_dim=swa_v_head_dim,
    )
