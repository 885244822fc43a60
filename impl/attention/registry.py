"""Attention-backend registry: names -> classes, resolved once at startup."""

from __future__ import annotations

import importlib
from typing import Any

# name -> "module:Class"; modules are imported lazily (triton is heavy and may
# need TRITON_INTERPRET set before it is imported).
_BACKENDS = {
    "torch_native": "impl.attention.torch_native:TorchNativeAttnBackend",
    "triton": "impl.attention.triton_backend:TritonAttnBackend",
}


def available_backends() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def create_attention_backend(name: str, model_config: Any, token_to_kv_pool: Any, req_to_token_pool: Any, device: Any):
    """Every backend takes (model_config, token_to_kv_pool, req_to_token_pool, device)."""
    if name not in _BACKENDS:
        raise ValueError(
            f"attention backend {name!r} is not implemented by this engine; choose one of {sorted(_BACKENDS)} "
            "with --attention-backend."
        )
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(model_config, token_to_kv_pool, req_to_token_pool, device)
