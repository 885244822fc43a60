"""Sampler: one next token per request from its last-row logits.

Order (SGLang's): penalties -> greedy argmax, or temperature -> top-k -> top-p
-> min-p -> draw with the request's own ``torch.Generator`` (inverse CDF over
the kept tokens, sorted by probability), so a seeded request draws the same
uniforms whatever else is in the batch.

Reported logprobs are ``log_softmax(penalised logits / T)`` with ``T = 1`` for
greedy requests (the distribution before top-k / top-p / min-p truncation,
as SGLang reports by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from impl.sampling.penalties import apply_penalties, needs_penalties
from impl.sampling.sampling_params import SamplingParams


@dataclass
class SampleRow:
    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float | None]  # logprob of the chosen token (None unless asked)
    top_logprobs: list[list[tuple[float, int]] | None]  # (logprob, token id), best first


def sample(logits: torch.Tensor, rows: Sequence[SampleRow], eos_ids: Sequence[int]) -> SampleOutput:
    """``logits``: [B, V] float32, row ``i`` for ``rows[i]``."""
    assert logits.dim() == 2 and logits.shape[0] == len(rows), "one logits row per request"
    logits = logits.float().clone()
    for i, r in enumerate(rows):
        if needs_penalties(r.params, len(r.output_ids)):
            apply_penalties(logits[i], r.params, r.prompt_ids, r.output_ids, eos_ids)
    greedy = [r.params.is_greedy for r in rows]
    temps = torch.tensor([1.0 if g else r.params.temperature for g, r in zip(greedy, rows)], dtype=torch.float32)
    scaled = logits / temps.to(logits.device)[:, None]  # [B, V]

    tokens = torch.argmax(scaled, dim=-1).tolist()
    sampled = [i for i, g in enumerate(greedy) if not g]
    if sampled:
        for i, t in zip(sampled, _draw(scaled[sampled], [rows[i] for i in sampled])):
            tokens[i] = t

    logprobs: list[float | None] = [None] * len(rows)
    top: list[list[tuple[float, int]] | None] = [None] * len(rows)
    want = [i for i, r in enumerate(rows) if r.return_logprob]
    if want:
        lp = torch.log_softmax(scaled[want], dim=-1)  # [b, V]
        for j, i in enumerate(want):
            logprobs[i] = float(lp[j, tokens[i]])
            k = rows[i].top_logprobs_num
            if k > 0:
                v, idx = torch.topk(lp[j], min(k, lp.shape[-1]))
                top[i] = list(zip(v.tolist(), idx.tolist()))
    return SampleOutput(tokens, logprobs, top)


def penalised_scaled(logits: torch.Tensor, rows: Sequence[SampleRow], eos_ids: Sequence[int]) -> torch.Tensor:
    """[B, V] logits after penalties and temperature (1 for greedy rows): what ``sample`` draws from."""
    logits = logits.float().clone()
    for i, r in enumerate(rows):
        if needs_penalties(r.params, len(r.output_ids)):
            apply_penalties(logits[i], r.params, r.prompt_ids, r.output_ids, eos_ids)
    temps = torch.tensor([1.0 if r.params.is_greedy else r.params.temperature for r in rows], dtype=torch.float32)
    return logits / temps.to(logits.device)[:, None]


def truncated_probs(scaled: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """[b, V] the distribution ``_draw`` samples from (top-k, top-p, min-p applied, renormalised), vocab order."""
    kept, idx_sorted = _truncate(scaled, rows)
    kept = kept / kept.sum(dim=-1, keepdim=True)
    return torch.zeros_like(kept).scatter_(1, idx_sorted, kept)


def _truncate(scaled: torch.Tensor, rows: Sequence[SampleRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept probabilities sorted descending with dropped entries 0, their token ids) [b, V] each."""
    vocab = scaled.shape[-1]
    probs_sorted, idx_sorted = torch.sort(torch.softmax(scaled, dim=-1), dim=-1, descending=True)  # [b, V]
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in rows], device=scaled.device)
    top_p = torch.tensor([r.params.top_p for r in rows], device=scaled.device, dtype=torch.float32)
    min_p = torch.tensor([r.params.min_p for r in rows], device=scaled.device, dtype=torch.float32)
    drop = ranks >= top_k[:, None]
    # top-p: drop a token when the mass before it already reaches top_p (the first is always kept)
    drop |= (torch.cumsum(probs_sorted, dim=-1) - probs_sorted) >= top_p[:, None]
    drop |= probs_sorted < (min_p * probs_sorted[:, 0])[:, None]
    drop[:, 0] = False
    return probs_sorted.masked_fill(drop, 0.0), idx_sorted


def _draw(scaled: torch.Tensor, rows: Sequence[SampleRow]) -> list[int]:
    """scaled: [b, V] temperature-scaled logits of the non-greedy rows."""
    vocab = scaled.shape[-1]
    kept, idx_sorted = _truncate(scaled, rows)
    cdf = torch.cumsum(kept, dim=-1)  # [b, V]
    out = []
    for j, r in enumerate(rows):
        u = torch.rand(1, generator=r.generator, dtype=torch.float32).to(cdf.device) * cdf[j, -1]
        pos = int(torch.searchsorted(cdf[j], u, right=True).clamp(max=vocab - 1))
        while pos > 0 and kept[j, pos] == 0:  # land on a kept token despite rounding at the top
            pos -= 1
        out.append(int(idx_sorted[j, pos]))
    return out
