"""Attention-backend resolution: ``auto`` is resolved once, declared and logged."""

from __future__ import annotations

from typing import Any

from impl.args.resolution import declare_resolution, platform_of, resolved_view, resolving_view


def handle_attention_backend_default(server_args: Any) -> None:
    """Unset backends resolve to triton on CUDA and torch_native on CPU.

    Runs after the fast-prefill pin (which may already have declared triton).
    """
    view = resolved_view(server_args)
    if view.attention_backend is not None:
        return
    platform = platform_of(server_args)
    choice = "triton" if platform.is_cuda else "torch_native"
    declare_resolution(server_args, "handle_attention_backend_default", attention_backend=choice)


def device_of(server_args: Any) -> str:
    cfg = resolving_view(server_args)
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if platform_of(server_args).is_cuda else "cpu"
