"""Attention-backend resolution: ``auto`` is resolved once, declared and logged."""

from __future__ import annotations

from typing import Any

from impl.args.resolution import declare_resolution, model_config_of, platform_of, resolved_view, resolving_view


def handle_attention_backend_default(server_args: Any) -> None:
    """An unset ``--attention-backend`` resolves to triton for Gemma-4 on every platform (SGLang 0.5.23's
    Gemma-4 model override: ``Use triton as default attention backend for Gemma4``, also when only the
    prefill or decode side is set); for other models to triton on CUDA and torch_native on CPU.

    Gemma-4 on triton both ways means ``--kv-sharing-fast-prefill`` on and off run the same attention
    arithmetic (the flag then changes only which rows the cross-decoder computes), so toggling the flag
    keeps greedy tokens identical in bf16 too. Runs after the fast-prefill pin (which may already have
    declared triton).
    """
    view = resolved_view(server_args)
    if view.attention_backend is not None:
        return
    if model_config_of(server_args).is_gemma4:
        choice = "triton"
    else:
        choice = "triton" if platform_of(server_args).is_cuda else "torch_native"
    declare_resolution(server_args, "handle_attention_backend_default", attention_backend=choice)


def device_of(server_args: Any) -> str:
    cfg = resolving_view(server_args)
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if platform_of(server_args).is_cuda else "cpu"
