"""Drafters: propose ``steps`` chain tokens per request from its seed (bonus token, target hidden).

``FrozenKVDrafter`` runs the Gemma-4 assistant (``impl/model/assistant.py``) over the
target's K/V, which it only reads (it owns no KV): every step queries position
``kv_len - 1`` (the last token with K/V, SGLang's "last written target slot"), over
keys ``0 .. kv_len - 1``; step ``k`` feeds the token drafted at step ``k - 1`` (the
bonus token first) and the assistant's projected hidden state (the target's
final-normed hidden of the last committed row first). Chain drafts take the
argmax of each step.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

import torch

from impl.engine.req import Req
from impl.forward_batch import pack_forward_batch
from impl.model.assistant import draft_span

logger = logging.getLogger("impl.engine")


class Drafter(Protocol):
    def draft(self, reqs: Sequence[Req], steps: int) -> list[list[int]]:
        """``steps`` draft tokens for each request (``req.output_ids[-1]`` is its bonus token)."""
        ...


class FrozenKVDrafter:
    def __init__(self, assistant, runner):
        self.assistant = assistant
        self.runner = runner

    @torch.no_grad()
    def draft(self, reqs: Sequence[Req], steps: int) -> list[list[int]]:
        dev = self.runner.device
        hidden = torch.stack([r.seed_hidden() for r in reqs]).to(dev)  # [B, backbone]
        fb = pack_forward_batch([draft_span(r.pool_idx, r.kv_len, r.output_ids[-1]) for r in reqs], dev,
                                req_to_token_pool=self.runner.req_to_token_pool,
                                token_to_kv_pool=self.runner.token_to_kv_pool, attn_backend=self.runner.decode_backend)
        out: list[torch.Tensor] = []
        rope = self.assistant.prepare(fb) if steps else None  # metadata and rope once per round
        for _ in range(steps):
            step = self.assistant.step(fb, hidden, rope)
            fb.input_ids = step.logits.argmax(dim=-1)
            hidden = step.hidden_states
            out.append(fb.input_ids)
        return torch.stack(out, dim=1).tolist() if out else [[] for _ in reqs]
