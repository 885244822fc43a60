"""check_server_args: bind the context, run every rule in order, log the resolutions."""

from __future__ import annotations

import logging
from typing import Any, Callable

from impl.args import attention, deterministic, dtype, kv_cache, kv_sharing, quantization, speculative
from impl.args.platform import Platform
from impl.args.resolution import context_of, resolutions_of
from impl.config.model_config import ModelConfig

logger = logging.getLogger("impl.args")


def hooks() -> list[Callable[[Any], None]]:
    """The rules in the order they run (read at call time so tests can see the list)."""
    return [
        speculative.handle_speculative_algorithm,
        speculative.handle_frozen_kv_mtp,
        kv_sharing.handle_kv_sharing_fast_prefill_backend,
        deterministic.handle_deterministic_attention_backend,
        attention.handle_attention_backend_default,
        dtype.handle_dtype_auto,
        kv_sharing.validate_kv_sharing_fast_prefill,
        deterministic.validate_deterministic_inference,
        quantization.validate_quantization,
        *kv_cache.KV_CACHE_HOOKS,
    ]


def check_server_args(
    server_args: Any,
    model_config: ModelConfig | None = None,
    platform: Platform | None = None,
    draft_model_config: ModelConfig | None = None,
) -> Any:
    """Validate and resolve ``server_args`` in place; raise ValueError/RuntimeError naming the flag.

    Returns the same object; ``server_args.resolved()`` gives the resolved copy.
    """
    ctx = context_of(server_args)
    ctx.resolutions.clear()
    ctx.overrides.clear()
    ctx.platform = platform or Platform.detect(server_args.device)
    if model_config is None:
        if server_args.model_path is None:
            raise ValueError("--model-path is required to check server arguments against a model.")
        model_config = ModelConfig.from_server_args(server_args)
    ctx.model_config = model_config.with_fast_prefill(bool(server_args.kv_sharing_fast_prefill))
    if draft_model_config is None and server_args.speculative_draft_model_path:
        draft_model_config = ModelConfig.from_pretrained(server_args.speculative_draft_model_path)
    ctx.draft_model_config = draft_model_config
    for hook in hooks():
        hook(server_args)
    for r in resolutions_of(server_args):
        logger.info("Resolved %s", r.describe())
    kv_sharing.log_kv_sharing_fast_prefill(server_args)
    return server_args
