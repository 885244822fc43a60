"""Rules of ``--kv-sharing-fast-prefill`` (seed 000, PR-A): F5-F12.

Every error names the flag, the offending value and the fix.
"""

from __future__ import annotations

import logging
from typing import Any

from impl.args.resolution import (
    attention_backends_of,
    declare_resolution,
    model_config_of,
    resolved_view,
    resolving_view,
)

logger = logging.getLogger("impl.args")

FLAG = "--kv-sharing-fast-prefill"
# Speculative algorithms whose draft/verify needs logits at every token of the
# extend batch, which the cross-decoder no longer computes.
PER_TOKEN_LOGIT_ALGOS = ("EAGLE", "EAGLE3")


def handle_kv_sharing_fast_prefill_backend(server_args: Any) -> None:
    """Pin the prefill backend to triton: an unset backend resolves to it (F8)."""
    cfg = resolving_view(server_args)
    if not cfg.kv_sharing_fast_prefill:
        return
    if cfg.attention_backend is None and cfg.prefill_attention_backend is None:
        declare_resolution(server_args, "handle_kv_sharing_fast_prefill_backend", attention_backend="triton")


def validate_kv_sharing_fast_prefill(server_args: Any) -> None:
    cfg = resolving_view(server_args)
    if not cfg.kv_sharing_fast_prefill:
        return
    mc = model_config_of(server_args)
    if not mc.is_gemma4:
        raise ValueError(
            f"{FLAG} needs a Gemma-4 model (model_type gemma4 or gemma4_text), but {mc.name!r} has "
            f"model_type={mc.model_type!r}. Drop {FLAG}, or serve a Gemma-4 checkpoint with "
            "num_kv_shared_layers > 0 (E2B, E4B)."
        )
    if mc.num_kv_shared_layers <= 0:
        raise ValueError(
            f"{FLAG} needs a model with KV-shared layers, but {mc.name!r} has num_kv_shared_layers=0 "
            "(no layer reuses another's K/V, so there is nothing to skip). Drop the flag for this model; "
            "it applies to E2B/E4B-style checkpoints."
        )
    prefill, _ = attention_backends_of(resolved_view(server_args))
    if prefill != "triton":
        which = "--prefill-attention-backend" if cfg.prefill_attention_backend else "--attention-backend"
        raise ValueError(
            f"{FLAG} needs the triton attention backend for prefill (it builds the back-half attention "
            f"metadata), but {which}={prefill}. Use {which} triton (or leave it unset), or drop {FLAG}."
        )
    algo = cfg.speculative_algorithm
    if algo in PER_TOKEN_LOGIT_ALGOS:
        raise ValueError(
            f"{FLAG} is incompatible with --speculative-algorithm {algo}: {algo} needs per-token hidden states "
            "and logits for every extend token, which fast prefill does not compute. Drop one of the two, or use "
            "--speculative-algorithm NEXTN with a Gemma-4 assistant draft (FROZEN_KV_MTP)."
        )


def log_kv_sharing_fast_prefill(server_args: Any) -> None:
    if not resolving_view(server_args).kv_sharing_fast_prefill:
        return
    mc = model_config_of(server_args)
    logger.info("KV-sharing fast prefill enabled for %s (num_kv_shared_layers=%d)", mc.name, mc.num_kv_shared_layers)
