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
