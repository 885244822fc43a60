"""Logit penalties and constraints applied before sampling (SGLang / OpenAI semantics).

* frequency / presence penalty: over the tokens generated so far (OpenAI):
  ``logit -= frequency * count + presence * (count > 0)``.
* repetition penalty: over prompt and generated tokens (HF / CTRL): a positive
  logit is divided by it, a negative one multiplied.
* min_new_tokens: EOS and stop_token_ids are masked until that many tokens exist.
* allowed_token_ids (vLLM's): every other token is masked.
* bad words (vLLM's): for each token sequence, its last token is masked where the output ends with the rest
  (a one-token sequence always).
A row left with no token (allowed_token_ids against a grammar or min_new_tokens) is a SamplingError: the
sampler's caller fails that request alone, as the client's error (a 400).
"""

from __future__ import annotations

from typing import Sequence

import torch

from impl.sampling.sampling_params import SamplingError, SamplingParams


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


def apply_token_limits(logits: torch.Tensor, params: SamplingParams, output_ids: Sequence[int]) -> None:
    """vLLM's allowed_token_ids and bad words on one request's row ``logits`` [V] (in place)."""
    if params.allowed_token_ids is not None:
        idx = params.allowed_index().to(logits.device)
        idx = idx[idx < logits.shape[-1]]
        kept = logits[idx]
        logits.fill_(float("-inf"))
        logits[idx] = kept
    for seq in params.bad_words_token_ids or ():
        k = len(seq) - 1
        if seq[-1] < logits.shape[-1] and k <= len(output_ids) and list(output_ids[len(output_ids) - k:]) == seq[:k]:
            logits[seq[-1]] = float("-inf")


def check_some_token_left(logits: torch.Tensor) -> None:
    """``logits`` [V]: one request's row after its masks; refuse a row that allows no token."""
    if not bool(torch.isfinite(logits).any()):
        raise SamplingError("allowed_token_ids", "no token is left to sample: allowed_token_ids excludes every token "
                            "the other constraints (the grammar, min_tokens, bad_words) allow; widen allowed_token_ids")


def needs_token_limits(params: SamplingParams) -> bool:
    return params.allowed_token_ids is not None or bool(params.bad_words_token_ids)


def needs_penalties(params: SamplingParams, num_output: int) -> bool:
    return (
        params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
        or params.repetition_penalty != 1.0
        or num_output < params.min_new_tokens
    )
