"""Prefill FLOPs of a Gemma-4 text model from its config fields, fast prefill on or off.

Works on the plain dict a subject reports (``ModelConfig`` field names: ``hidden_size``,
``layer_types``, ``layer_head_dims``, ``layer_num_kv_heads``, ``num_kv_shared_layers``,
...), so it needs no implementation. Counts 2 FLOPs per multiply-add in the linear
layers (q/o everywhere; k/v only on layers that own KV, no v_proj on k_eq_v full
layers), the dense MLP (double-wide on KV-shared layers when the config says so), the
PLE gate and projection, and attention scores + values under causal and sliding-window
masks; the LM head on the one sampled row in both modes. Norms, RoPE and activations
(O(hidden) per row) are left out.
"""

from __future__ import annotations

from typing import Any, Mapping

SLIDING = "sliding_attention"


def _visible_keys(t: int, window: int | None) -> int:
    """Sum over query positions 0..t-1 of the keys each sees (causal, optional window)."""
    if window is None or window >= t:
        return t * (t + 1) // 2
    return window * (window + 1) // 2 + (t - window) * window


def _producer(cfg: Mapping[str, Any], i: int) -> int:
    first = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    if i < first:
        return i
    same = [j for j in range(first) if cfg["layer_types"][j] == cfg["layer_types"][i]]
    return same[-1] if same else i


def _layer_flops(cfg: Mapping[str, Any], i: int, rows: int, visible: int) -> int:
    hid, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg["layer_head_dims"][i]
    shared = i >= cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    sliding = cfg["layer_types"][i] == SLIDING
    kv_heads = cfg["layer_num_kv_heads"][_producer(cfg, i)]
    qo = 2 * (2 * hid * heads * d)
    kv = 0 if shared else 2 * hid * kv_heads * d * (1 if cfg.get("attention_k_eq_v") and not sliding else 2)
    inter = cfg["intermediate_size"] * (2 if cfg.get("use_double_wide_mlp") and shared else 1)
    ple = 2 * (2 * hid * cfg.get("hidden_size_per_layer_input", 0))
    attn = 2 * 2 * heads * d * visible
    return rows * (qo + kv + 3 * 2 * hid * inter + ple) + attn


REQUIRED = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "num_kv_shared_layers",
            "layer_types", "layer_head_dims", "layer_num_kv_heads", "vocab_size")


def prefill_flops(cfg: Mapping[str, Any], t: int, fast: bool) -> float:
    """FLOPs of prefilling one ``t``-token prompt (no cached prefix), fast prefill on or off."""
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"the model config lacks {missing}: cannot compute the prefill FLOP bound")
    if cfg.get("enable_moe_block"):
        raise ValueError("the FLOP model counts dense MLPs only; use a model without an MoE block")
    first = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    window = cfg.get("sliding_window")
    total = 0
    for i in range(cfg["num_hidden_layers"]):
        w = window if cfg["layer_types"][i] == SLIDING else None
        if fast and i >= first:
            total += _layer_flops(cfg, i, 1, min(t, w) if w else t)  # the last row over its context
        else:
            total += _layer_flops(cfg, i, t, _visible_keys(t, w))
    total += t * 2 * cfg["hidden_size"] * cfg["num_hidden_layers"] * cfg.get("hidden_size_per_layer_input", 0)
    total += 2 * cfg["hidden_size"] * cfg["vocab_size"]
    return float(total)


def flop_bound(cfg: Mapping[str, Any], t: int) -> float:
    """Prefill FLOPs with fast prefill off over on: the most a ``t``-token prefill can speed up."""
    return prefill_flops(cfg, t, fast=False) / prefill_flops(cfg, t, fast=True)


def config_from_hf(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The fields ``prefill_flops`` reads, from a Gemma-4 checkpoint's ``config.json`` (text-only, or the text model
    under ``text_config``): per-layer head dims and KV heads as HF derives them (``global_head_dim`` /
    ``num_global_key_value_heads`` on full-attention layers, a ``per_layer_config`` block where transformers wrote one)."""
    c = dict(raw.get("text_config") or raw) if raw.get("model_type") == "gemma4" else dict(raw)
    if not str(c.get("model_type", "")).startswith("gemma4"):
        raise ValueError(f"the FLOP model knows Gemma-4 text models; this config is {c.get('model_type')!r}")
    n = int(c["num_hidden_layers"])
    types = list(c.get("layer_types") or [SLIDING if (i + 1) % 6 else "full_attention" for i in range(n)])
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    head_dim, kv = int(c.get("head_dim", 256)), int(c.get("num_key_value_heads", 1))
    k_eq_v = bool(c.get("attention_k_eq_v", False))
    g_dim = int(c.get("global_head_dim", 512))
    g_kv = int(c["num_global_key_value_heads"]) if (c.get("num_global_key_value_heads") is not None and k_eq_v) else kv
    per_layer = {int(k): v for k, v in (c.get("per_layer_config") or {}).items() if str(k).isdigit()}
    dims, heads = [], []
    for i, t in enumerate(types):
        over = per_layer.get(i)
        if over is not None:
            dims.append(int(over.get("head_dim", head_dim)))
            heads.append(int(over.get("num_key_value_heads", kv)))
        else:
            dims.append(head_dim if t == SLIDING else g_dim)
            heads.append(kv if t == SLIDING else g_kv)
    return {
        "hidden_size": int(c["hidden_size"]), "num_attention_heads": int(c["num_attention_heads"]),
        "intermediate_size": int(c["intermediate_size"]), "num_hidden_layers": n,
        "num_kv_shared_layers": int(c.get("num_kv_shared_layers", 0) or 0), "layer_types": types,
        "layer_head_dims": dims, "layer_num_kv_heads": heads, "vocab_size": int(c["vocab_size"]),
        "sliding_window": c.get("sliding_window"), "attention_k_eq_v": k_eq_v,
        "use_double_wide_mlp": bool(c.get("use_double_wide_mlp", False)),
        "hidden_size_per_layer_input": int(c.get("hidden_size_per_layer_input", 0) or 0),
        "enable_moe_block": bool(c.get("enable_moe_block", False)),
    }
