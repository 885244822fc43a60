"""Speculative-algorithm resolution: NEXTN on Gemma-4 becomes FROZEN_KV_MTP (F12)."""

from __future__ import annotations

import logging
from typing import Any

from impl.args.resolution import declare_resolution, draft_model_config_of, resolving_view

logger = logging.getLogger("impl.args")


def handle_speculative_algorithm(server_args: Any) -> None:
    cfg = resolving_view(server_args)
    if cfg.speculative_algorithm != "NEXTN":
        return
    draft = draft_model_config_of(server_args)
    if draft is None:
        raise ValueError(
            "--speculative-algorithm NEXTN: this engine implements NEXTN only as FROZEN_KV_MTP with a Gemma-4 "
            "assistant draft, and no --speculative-draft-model-path was given. Pass "
            "--speculative-draft-model-path <folder of a gemma4_assistant checkpoint>."
        )
    if not draft.is_assistant:
        raise ValueError(
            "--speculative-algorithm NEXTN: this engine implements NEXTN only as FROZEN_KV_MTP with a Gemma-4 "
            f"assistant draft, but --speculative-draft-model-path={cfg.speculative_draft_model_path} has "
            f"model_type={draft.model_type!r}. Pass a gemma4_assistant checkpoint, or choose another algorithm."
        )
    declare_resolution(server_args, "handle_speculative_algorithm", speculative_algorithm="FROZEN_KV_MTP")
    logger.info(
        "Speculative algorithm NEXTN promoted to FROZEN_KV_MTP for Gemma-4 assistant draft %s", draft.name
    )
