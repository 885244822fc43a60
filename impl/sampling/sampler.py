"""Sampler: one next token per request from its last-row logits.

Order (SGLang's): penalties, ``logit_bias``, vLLM's allowed_token_ids and bad words, and the grammar's token bitmask
(``impl/constrained``: disallowed tokens get -inf) -> greedy argmax, or temperature -> top-k -> top-p
-> min-p -> draw with the request's own ``torch.Generator`` (inverse CDF over
the kept tokens, sorted by probability), so a seeded request draws the same
uniforms whatever else is in the batch. Built for a 262,144-entry vocabulary:
``sample`` says what it computes over the vocabulary per row (a few passes,
no sort in the common case, no [B, V] intermediate tables).

Reported logprobs are ``log_softmax(penalised logits / T)`` with ``T = 1`` for
greedy requests (the distribution before top-k / top-p / min-p truncation,
as SGLang reports by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from impl.sampling.penalties import (apply_penalties, apply_token_limits, check_some_token_left, needs_penalties,
                                    needs_token_limits)
from impl.sampling.sampling_params import SamplingParams


@dataclass
class SampleRow:
    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator | None  # None: the global generator (tests that build a Req by hand)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    token_bitmask: torch.Tensor | None = None  # [ceil(V / 32)] int32: the grammar's allowed tokens (None: all)


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float | None]  # logprob of the chosen token (None unless asked)
    top_logprobs: list[list[tuple[float, int]] | None]  # (logprob, token id), best first


# Candidates examined before a full sort: top-k / top-p / min-p keep a prefix of the tokens sorted by
# probability, so when that prefix ends within the CANDIDATES most likely tokens (nearly always), one
# torch.topk over the vocabulary replaces the sort of all 262,144 entries.
CANDIDATES = 1024


def sample(logits: torch.Tensor, rows: Sequence[SampleRow], eos_ids: Sequence[int]) -> SampleOutput:
    """``logits``: [B, V] float32, row ``i`` for ``rows[i]`` (not modified).

    Work over the vocabulary per row, built for Gemma-4's 262,144 entries: a greedy row one max (plus,
    for logprobs, one exp-sum); a sampled row one scaling and one softmax (max, exp, sum), then one
    cumulative sum (no truncation) or one top-k (a truncation within ``CANDIDATES`` tokens) or a radix
    selection (a longer one), never a sort of the vocabulary; ``top_logprobs`` one top-k. Penalties touch
    only the tokens they name. The log-softmax is never materialised: logprobs are logit - logsumexp."""
    assert logits.dim() == 2 and logits.shape[0] == len(rows), "one logits row per request"
    logits = _penalised(logits.float(), rows, eos_ids)
    tokens = [0] * len(rows)
    lse: list[float | None] = [None] * len(rows)
    report: dict[int, torch.Tensor] = {}  # row -> the logits its logprobs are reported over
    g_idx = [i for i, r in enumerate(rows) if r.params.is_greedy]
    if g_idx:
        g_logits = logits if len(g_idx) == len(rows) else logits[g_idx]
        g_max, g_arg = torch.max(g_logits, dim=-1)
        for j, (i, t) in enumerate(zip(g_idx, g_arg.tolist())):
            tokens[i] = t
            if rows[i].return_logprob:  # greedy rows report at T = 1
                m = g_max[j]
                lse[i] = float(m + torch.log(torch.exp(g_logits[j] - m).sum()))
                report[i] = g_logits[j]
    s_idx = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if s_idx:
        temps = torch.tensor([rows[i].params.temperature for i in s_idx], dtype=torch.float32, device=logits.device)
        scaled = logits[s_idx].div_(temps[:, None])  # [b, V] (logits[list] is a copy)
        m = scaled.max(dim=-1, keepdim=True).values
        probs = torch.exp(scaled - m)
        total = probs.sum(dim=-1, keepdim=True)
        probs.div_(total)  # softmax, [b, V]
        row_lse = (m + torch.log(total)).squeeze(-1).tolist()
        for j, i in enumerate(s_idx):
            tokens[i] = _draw_row(scaled[j], probs[j], rows[i])
            lse[i] = row_lse[j]
            report[i] = scaled[j]

    logprobs: list[float | None] = [None] * len(rows)
    top: list[list[tuple[float, int]] | None] = [None] * len(rows)
    for i, r in enumerate(rows):
        if not r.return_logprob:
            continue
        row, lse_i = report[i], float(lse[i])  # type: ignore[arg-type]
        logprobs[i] = float(row[tokens[i]]) - lse_i
        if r.top_logprobs_num > 0:
            v, idx = torch.topk(row, min(r.top_logprobs_num, row.shape[-1]))
            top[i] = [(x - lse_i, t) for x, t in zip(v.tolist(), idx.tolist())]
    return SampleOutput(tokens, logprobs, top)


def _penalised(logits: torch.Tensor, rows: Sequence[SampleRow], eos_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` with each row's penalties, logit bias and token bitmask applied (a copy only when some row
    has one)."""
    pen = [i for i, r in enumerate(rows) if needs_penalties(r.params, len(r.output_ids))]
    bias = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
    limited = [i for i, r in enumerate(rows) if needs_token_limits(r.params)]
    masks = [(i, r.token_bitmask) for i, r in enumerate(rows) if r.token_bitmask is not None]
    masked = [i for i, _ in masks]
    if not (pen or bias or limited or masked):
        return logits
    logits = logits.clone()
    for i in pen:
        apply_penalties(logits[i], rows[i].params, rows[i].prompt_ids, rows[i].output_ids, eos_ids)
    for i, b in bias:
        apply_logit_bias(logits[i], b)
    for i in limited:
        apply_token_limits(logits[i], rows[i].params, rows[i].output_ids)
    if masked:
        from impl.constrained.bitmask import apply_bitmask

        width = max(m.shape[-1] for _, m in masks)
        bitmask = torch.full((len(rows), width), -1, dtype=torch.int32)
        for i, m in masks:
            bitmask[i, : m.shape[-1]] = m
        apply_bitmask(logits, bitmask, masked)
    for i in limited:
        check_some_token_left(logits[i])
    return logits


def apply_logit_bias(row: torch.Tensor, bias: dict[int, float]) -> None:
    """row: [V] one request's logits (in place); ids beyond the row are ignored."""
    ids = [t for t in bias if t < row.shape[-1]]
    if ids:
        row[torch.tensor(ids, dtype=torch.int64, device=row.device)] += torch.tensor(
            [float(bias[t]) for t in ids], dtype=row.dtype, device=row.device)


def penalised_scaled(logits: torch.Tensor, rows: Sequence[SampleRow], eos_ids: Sequence[int]) -> torch.Tensor:
    """[B, V] logits after penalties and temperature (1 for greedy rows): what ``sample`` draws from."""
    logits = _penalised(logits.float(), rows, eos_ids)
    temps = torch.tensor([1.0 if r.params.is_greedy else r.params.temperature for r in rows], dtype=torch.float32)
    return logits / temps.to(logits.device)[:, None]


def truncated_probs(scaled: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """[b, V] the distribution ``sample`` draws from (top-k, top-p, min-p applied, renormalised), vocab order."""
    probs = torch.softmax(scaled, dim=-1)
    out = torch.zeros_like(scaled)
    for j, r in enumerate(rows):
        weights, ids = _support(scaled[j], probs[j], r.params)
        if ids is None:
            out[j] = weights / weights.sum()
        else:
            out[j].scatter_(0, ids, weights / weights.sum())
    return out


def _support(scaled: torch.Tensor, probs: torch.Tensor, params) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One row's kept tokens after top-k, top-p and min-p, unnormalised: ``(weights [K], token ids [K])``
    sorted by probability, or ``(weights [V], None)`` in vocabulary order (dropped tokens 0).
    ``scaled``: the row's temperature-scaled logits [V]; ``probs``: their softmax.

    The kept set is a prefix of the tokens sorted by probability (SGLang's rule: top-k ranks; top-p
    keeps a token while the mass before it is below top_p; min-p drops tokens under min_p x the
    largest; the most likely is always kept). Found without sorting the vocabulary: no truncation
    (the defaults): every token, vocabulary order; a prefix within the ``CANDIDATES`` most likely
    tokens (one top-k; the usual case for trained models): those, sorted; a longer one (a flat
    distribution): a probability threshold by radix selection (``_top_p_threshold``), vocabulary order."""
    vocab = probs.shape[-1]
    top_k = params.top_k if 0 < params.top_k < vocab else vocab
    if top_k >= vocab and params.top_p >= 1.0 and params.min_p <= 0.0:
        return probs, None
    k = min(top_k, CANDIDATES)
    vals, idx = torch.topk(probs, k)  # sorted descending
    kept = _keep(vals, top_k, params.top_p, params.min_p)
    if k == top_k or kept[-1] == 0:
        return kept, idx
    keep = probs >= vals[0] * params.min_p if params.min_p > 0.0 else torch.ones_like(probs, dtype=torch.bool)
    if params.top_p < 1.0:
        keep &= probs >= _top_p_threshold(probs, params.top_p)
    if top_k < vocab:
        keep &= scaled >= torch.topk(scaled, top_k).values[-1]
    keep[int(idx[0])] = True
    return probs * keep, None


def _top_p_threshold(probs: torch.Tensor, top_p: float) -> float:
    """The probability of the last token top-p keeps (tokens sorted by probability), by radix selection:
    non-negative float32s order like their bit patterns, so a weighted histogram of the top 16 bits
    finds the bucket where the mass crosses ``top_p``, and only that bucket is sorted."""
    bits = probs.view(torch.int32)
    hi = bits >> 16  # [V] in [0, 2^15)
    mass = torch.bincount(hi, weights=probs, minlength=1 << 15)  # float64 per bucket
    above = torch.flip(torch.cumsum(torch.flip(mass, [0]), 0), [0])  # mass of this bucket and every higher one
    crossing = torch.nonzero(above >= top_p)
    b = int(crossing[-1]) if crossing.numel() else 0
    before = float(above[b + 1]) if b + 1 < above.numel() else 0.0
    vals = torch.sort(probs[hi == b], descending=True).values.double()
    cum = before + torch.cumsum(vals, 0)
    hit = torch.nonzero(cum >= top_p)
    return float(vals[int(hit[0])] if hit.numel() else vals[-1])


def _keep(probs_sorted: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """probs_sorted [K] descending -> the same with dropped tokens set to 0 (the first is always kept)."""
    ranks = torch.arange(probs_sorted.shape[-1], device=probs_sorted.device)
    drop = ranks >= top_k
    # top-p: drop a token when the mass before it already reaches top_p
    drop |= (torch.cumsum(probs_sorted, dim=-1) - probs_sorted) >= top_p
    drop |= probs_sorted < min_p * probs_sorted[0]
    drop[0] = False
    return probs_sorted.masked_fill(drop, 0.0)


def _draw_row(scaled: torch.Tensor, probs: torch.Tensor, row: SampleRow) -> int:
    """One sampled row's token: inverse CDF over its kept tokens (``_support``'s order) with the request's
    own generator, so a seeded request draws the same whatever else is in the batch."""
    weights, ids = _support(scaled, probs, row.params)
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(1, generator=row.generator, dtype=torch.float32).to(cdf.device) * cdf[-1]
    pos = int(torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[-1] - 1))
    while pos > 0 and weights[pos] == 0:  # land on a kept token despite rounding at the top
        pos -= 1
    return int(pos if ids is None else ids[pos])
