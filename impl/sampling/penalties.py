"""Logit penalties and constraints applied before sampling (SGLang / OpenAI semantics).

* frequency / presence penalty: over the tokens generated so far (OpenAI):
  ``logit -= frequency * count + presence * (count > 0)``.
* repetition penalty: over prompt and generated tokens (HF / CTRL): a positive
  logit is divided by it, a negative one multiplied.
* min_new_tokens: EOS and stop_token_ids are masked until that many tokens exist.
"""

from __future__ import annotations

from typing import Sequence

import torch

from impl.sampling.sampling_params import SamplingParams


def apply_penalties(
    logits: torch.Tensor,  # [V] float32, one request's row (modified in place)
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    eos_ids: Sequence[int],
) -> None:
    vocab = logits.shape[-1]
    # every penalty touches only the tokens it names (no vocabulary-sized count table)
    if output_ids and (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0):
        ids, counts = torch.unique(torch.tensor(output_ids, dtype=torch.int64), return_counts=True)
        keep = ids < vocab
        ids = ids[keep].to(logits.device)
        counts = counts[keep].to(device=logits.device, dtype=logits.dtype)
        logits[ids] -= params.frequency_penalty * counts + params.presence_penalty
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.int64, device=logits.device)
        seen = seen[seen < vocab]
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if len(output_ids) < params.min_new_tokens:
        banned = [t for t in list(params.stop_token_ids) + ([] if params.ignore_eos else list(eos_ids)) if t < vocab]
        if banned:
            logits[torch.tensor(banned, dtype=torch.int64, device=logits.device)] = float("-inf")


def needs_penalties(params: SamplingParams, num_output: int) -> bool:
    return (
        params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
        or params.repetition_penalty != 1.0
        or num_output < params.min_new_tokens
    )
