"""Speculative-algorithm rules: NEXTN on Gemma-4 becomes FROZEN_KV_MTP (F12), and its chain shape.

``handle_speculative_algorithm`` promotes NEXTN with a Gemma-4 assistant draft to
FROZEN_KV_MTP. ``handle_frozen_kv_mtp`` then, as SGLang does for FROZEN_KV_MTP:

* resolves an unset chain to steps 3, topk 1, draft tokens 4 (a declared resolution;
  one given value determines the others: draft tokens = steps + 1 with topk 1);
* refuses inconsistent values (steps < 1, draft tokens != steps + 1) and tree drafts
  (topk > 1, not implemented) with a ValueError naming the flags;
* defaults ``--max-running-requests`` to 48 (declared);
* checks the draft config against the target's (backbone hidden size, vocabulary,
  each assistant layer's type and head dim against the target layer whose K/V it
  reads), so a mismatch stops the launch instead of the first request.

Mixed chunked prefill is off under speculation: prefill batches and verify batches
run as separate forwards (the engine has no mixed-chunk flag to resolve; the engine
reports it in ``/get_server_info`` under ``speculative``).
"""

from __future__ import annotations

import logging
from typing import Any

from impl.args.resolution import declare_resolution, draft_model_config_of, model_config_of, resolving_view

logger = logging.getLogger("impl.args")

FROZEN_KV_MTP = "FROZEN_KV_MTP"
DEFAULT_NUM_STEPS = 3
DEFAULT_MAX_RUNNING_REQUESTS = 48


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
    declare_resolution(server_args, "handle_speculative_algorithm", speculative_algorithm=FROZEN_KV_MTP)
    logger.info(
        "Speculative algorithm NEXTN promoted to FROZEN_KV_MTP for Gemma-4 assistant draft %s", draft.name
    )


def is_frozen_kv_mtp(server_args: Any) -> bool:
    from impl.args.resolution import resolved_view

    return resolved_view(server_args).speculative_algorithm == FROZEN_KV_MTP


def handle_frozen_kv_mtp(server_args: Any) -> None:
    """Chain shape, scheduler defaults and the draft/target match for FROZEN_KV_MTP."""
    if not is_frozen_kv_mtp(server_args):
        return
    cfg = resolving_view(server_args)
    draft = draft_model_config_of(server_args)
    if draft is None or not draft.is_assistant:
        raise ValueError(
            "--speculative-algorithm FROZEN_KV_MTP needs --speculative-draft-model-path <folder of a gemma4_assistant "
            "checkpoint> (the Gemma-4 MTP assistant of the target model)."
        )
    _resolve_chain(server_args, cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens)
    if cfg.max_running_requests is None:
        declare_resolution(server_args, "handle_frozen_kv_mtp", max_running_requests=DEFAULT_MAX_RUNNING_REQUESTS)
    check_draft_matches_target(draft, model_config_of(server_args))


def _resolve_chain(server_args: Any, steps: int | None, topk: int | None, draft_tokens: int | None) -> None:
    if topk is not None and topk > 1:
        raise ValueError(
            f"--speculative-eagle-topk {topk}: tree drafts (topk > 1) are not implemented for FROZEN_KV_MTP in this "
            "engine; use a chain draft (--speculative-eagle-topk 1, or leave it unset)."
        )
    if topk is not None and topk < 1:
        raise ValueError(f"--speculative-eagle-topk must be >= 1, got {topk}.")
    if steps is not None and steps < 1:
        raise ValueError(f"--speculative-num-steps must be >= 1 for FROZEN_KV_MTP, got {steps}.")
    if draft_tokens is not None and draft_tokens < 2:
        raise ValueError(
            f"--speculative-num-draft-tokens must be >= 2 (the bonus token plus at least one draft), got {draft_tokens}."
        )
    if steps is not None and draft_tokens is not None and draft_tokens != steps + 1:
        raise ValueError(
            f"--speculative-num-draft-tokens {draft_tokens} with --speculative-num-steps {steps}: a chain draft "
            f"(--speculative-eagle-topk 1) verifies steps + 1 tokens, so --speculative-num-draft-tokens must be "
            f"{steps + 1} (or leave one of the two unset)."
        )
    given = {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft_tokens}
    if steps is None:
        steps = DEFAULT_NUM_STEPS if draft_tokens is None else draft_tokens - 1
    values = {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}
    unset = {k: v for k, v in values.items() if given[k] is None}
    if unset:
        declare_resolution(server_args, "handle_frozen_kv_mtp", **unset)


def check_draft_matches_target(draft: Any, target: Any) -> None:
    """ValueError when the assistant cannot run over this target's K/V and hidden states."""
    where = "--speculative-draft-model-path"
    if draft.backbone_hidden_size != target.hidden_size:
        raise ValueError(
            f"{where}: the assistant's backbone_hidden_size {draft.backbone_hidden_size} != the target's hidden_size "
            f"{target.hidden_size}; this assistant was trained for a different target model."
        )
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"{where}: the assistant's vocab_size {draft.vocab_size} != the target's {target.vocab_size}; "
            "pass the assistant of this target model."
        )
    first = target.first_kv_shared_layer
    for i, t in enumerate(draft.layer_types):
        producers = [j for j in range(first) if target.layer_types[j] == t]
        if not producers:
            raise ValueError(
                f"{where}: assistant layer {i} is {t}, but the target has no non-shared {t} layer whose K/V it "
                "could read; the assistant does not belong to this target."
            )
        kv = producers[-1]
        if target.layer_head_dims[kv] != draft.layer_head_dims[i]:
            raise ValueError(
                f"{where}: assistant layer {i} ({t}) has head_dim {draft.layer_head_dims[i]}, but the target layer "
                f"{kv} whose K/V it reads has head_dim {target.layer_head_dims[kv]}; assistant and target do not match."
            )
