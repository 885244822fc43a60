"""Acceptance of a chain draft against the target's verify logits.

One request's verify block has ``s + 1`` logits rows: row ``i`` follows the bonus
token and drafts ``d_1 .. d_i``, so it scores the token after ``d_i``. The
committed tokens are ``t_0 .. t_j``: the accepted drafts ``d_1 .. d_j`` (``t_{i-1} =
d_i``) and one token of the target's own (the first rejection's replacement, or
the bonus after an all-accepted chain), so a verify commits ``1 .. s + 1`` tokens.

* Greedy requests: ``t_i`` is the target's sampler output for row ``i`` (argmax of
  the penalised logits, penalties seeing ``d_1 .. d_i`` as generated); the chain
  is accepted while ``d_{i+1} == t_i``. The committed tokens equal those of plain
  decoding, token for token.
* Sampled requests (SGLang's target-only speculative sampling for chain drafts):
  the draft proposes its argmax, a point mass ``q = 1{d}``; ``p_i`` is the target's
  truncated distribution at row ``i`` (penalties, temperature, top-k, top-p, min-p,
  as the sampler applies them). Draft ``d_{i+1}`` is accepted with probability
  ``min(1, p_i(d) / q(d)) = p_i(d)``; on rejection the token is drawn from the
  residual ``max(p_i - q, 0)`` renormalised (``p_i`` without ``d``); after an
  all-accepted chain the bonus is drawn from ``p_s``. Every committed token is
  therefore distributed exactly as ``p`` (the target's distribution), whatever the
  draft proposes. Uniforms come from the request's own generator.

Reported logprobs are the sampler's: ``log_softmax`` of the penalised, scaled
logits of the row that produced the token.

Constrained requests (a grammar): row ``i`` is masked with the grammar's
allowed tokens after ``d_1 .. d_i`` (``masks[i]``, computed by advancing the
request's matcher along the drafts and rolling it back), so ``p_i`` is the
constrained distribution and a draft the grammar forbids has ``p_i(d) = 0``:
it is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from impl.sampling.sampler import SampleRow, penalised_scaled, sample, truncated_probs


@dataclass
class Accepted:
    tokens: list[int]  # t_0 .. t_j (j + 1 tokens)
    num_accepted_drafts: int  # j
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[float, int]] | None]


RowMasks = Sequence["torch.Tensor | None"]  # one token bitmask per verify row (None: unconstrained)


def _rows(base: SampleRow, drafts: Sequence[int], masks: RowMasks | None = None) -> list[SampleRow]:
    """Row i sees the drafts before it as generated output (penalties, min_new_tokens) and, for a constrained
    request, the grammar's mask after them."""
    out = list(base.output_ids)
    return [
        SampleRow(base.params, base.prompt_ids, out + list(drafts[:i]), base.generator, base.return_logprob,
                  base.top_logprobs_num, token_bitmask=None if masks is None else masks[i])
        for i in range(len(drafts) + 1)
    ]


def accept_greedy(logits: torch.Tensor, base: SampleRow, drafts: Sequence[int], eos_ids: Sequence[int],
                  masks: RowMasks | None = None) -> Accepted:
    """logits: [s + 1, V] verify rows of one greedy request; drafts: d_1 .. d_s."""
    return accept_greedy_batch(logits, [(base, drafts)], eos_ids, [masks])[0]


def accept_greedy_batch(logits: torch.Tensor, reqs: Sequence[tuple[SampleRow, Sequence[int]]],
                        eos_ids: Sequence[int], masks: Sequence[RowMasks | None] | None = None) -> list[Accepted]:
    """Several greedy requests at once (one sampler call): ``logits`` holds their verify blocks in order;
    ``masks[k]``: request k's per-row grammar masks (None: unconstrained)."""
    masks = masks if masks is not None else [None] * len(reqs)
    rows = [row for (base, drafts), m in zip(reqs, masks) for row in _rows(base, drafts, m)]
    out = sample(logits, rows, eos_ids)
    res, off = [], 0
    for _, drafts in reqs:
        toks = out.token_ids[off : off + len(drafts) + 1]
        j = 0
        while j < len(drafts) and drafts[j] == toks[j]:
            j += 1
        res.append(Accepted(toks[: j + 1], j, out.logprobs[off : off + j + 1], out.top_logprobs[off : off + j + 1]))
        off += len(drafts) + 1
    return res


def accept_sampled(logits: torch.Tensor, base: SampleRow, drafts: Sequence[int], eos_ids: Sequence[int],
                   masks: RowMasks | None = None) -> Accepted:
    """Speculative (rejection) sampling with a point-mass draft; see the module doc."""
    rows = _rows(base, drafts, masks)
    scaled = penalised_scaled(logits, rows, eos_ids)  # [s + 1, V]
    probs = truncated_probs(scaled, rows)  # [s + 1, V]
    tokens: list[int] = []
    for i, d in enumerate(drafts):
        u = float(torch.rand(1, generator=base.generator, dtype=torch.float32))
        if u < float(probs[i, d]):
            tokens.append(int(d))
            continue
        residual = rejection_residual(probs[i], int(d))
        if float(residual.sum()) <= 0.0:  # p_i is a point mass on d (u >= p_i(d) only by rounding)
            tokens.append(int(d))
            continue
        tokens.append(_draw_from(residual, base.generator))
        break
    else:
        tokens.append(_draw_from(probs[len(drafts)], base.generator))
    j = len(tokens) - 1
    logprobs: list[float | None] = [None] * len(tokens)
    top: list[list[tuple[float, int]] | None] = [None] * len(tokens)
    if base.return_logprob:
        lp = torch.log_softmax(scaled[: len(tokens)], dim=-1)
        for i, t in enumerate(tokens):
            logprobs[i] = float(lp[i, t])
            if base.top_logprobs_num > 0:
                v, idx = torch.topk(lp[i], min(base.top_logprobs_num, lp.shape[-1]))
                top[i] = list(zip(v.tolist(), idx.tolist()))
    return Accepted(tokens, j, logprobs, top)


def rejection_residual(p: torch.Tensor, draft: int) -> torch.Tensor:
    """``max(p - q, 0)`` for the point-mass draft ``q = 1{draft}`` (unnormalised): ``p`` without the draft."""
    out = p.clone()
    out[draft] = 0.0
    return out


def _draw_from(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from unnormalised non-negative ``weights`` [V] (inverse CDF, the request's generator)."""
    cdf = torch.cumsum(weights, dim=-1)
    u = torch.rand(1, generator=generator, dtype=torch.float32) * cdf[-1]
    pos = int(torch.searchsorted(cdf, u, right=True).clamp(max=weights.shape[0] - 1))
    while pos > 0 and weights[pos] == 0:
        pos -= 1
    return pos
