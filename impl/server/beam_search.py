"""vLLM's beam search on the OpenAI routes (``use_beam_search``), driven from the server as vLLM drives it.

Beam width is the request's ``n``. Each step submits one engine request per live beam (its prompt: the
original prompt and the beam's tokens so far; one new token, greedy, with the ``2 * width`` most likely next
tokens and their logprobs), all at once: the radix cache holds every beam's prefix, so a step prefills one
token per beam. Every beam's top tokens are candidates, scored by cumulative logprob; a stop token (the
model's EOS ids, unless ``ignore_eos``) ends its candidate as a finished sequence, the ``width`` best others
continue. After ``max_tokens`` steps (or when no beam continues) finished and live sequences are ranked by
``cum_logprob / len ** length_penalty`` (``len``: prompt and output tokens, a final stop token not counted:
vLLM's rule) and the ``width`` best become the choices, best first. Logprobs are the model's own (T = 1):
beam search is deterministic, as vLLM's with its default raw logprobs.

A step request that fails fails the call with its error; a client that disconnects aborts the step in flight.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from impl.engine.output import Logprobs, ReqOutput
from impl.engine.req import FinishReason, Req
from impl.server.async_engine import AsyncEngine
from impl.server.streaming import failure_of


class BeamFailure(Exception):
    """A step's engine request failed: (HTTP status, message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Beam:
    tokens: list[int] = field(default_factory=list)  # output tokens (a stop token last only when kept)
    cum_logprob: float = 0.0
    logprobs: list[tuple[float, int]] = field(default_factory=list)  # (logprob, token) per output token
    tops: list[list[tuple[float, int]]] = field(default_factory=list)  # each step's most likely tokens
    finish: FinishReason | None = None
    scored_len: int = 0  # output tokens the length penalty counts (a stop token not)

    def extend(self, tok: int, lp: float, top: list[tuple[float, int]], keep: bool = True,
               scored: bool = True) -> "Beam":
        """This beam and ``tok`` (its logprob ``lp``; the step's ``top`` tokens). ``keep`` false: only its logprob
        counts (a stop token left out of the output); ``scored`` false: the length penalty does not count it."""
        if not keep:
            return Beam(list(self.tokens), self.cum_logprob + lp, list(self.logprobs), list(self.tops),
                        scored_len=self.scored_len)
        return Beam(self.tokens + [tok], self.cum_logprob + lp, self.logprobs + [(lp, tok)], self.tops + [top],
                    scored_len=self.scored_len + (1 if scored else 0))


@dataclass(frozen=True)
class BeamSpec:
    """What a beam-search call asked for (the rest is on its template requests)."""

    width: int
    length_penalty: float
    include_stop: bool  # vLLM's include_stop_str_in_output: the stop token stays in the token ids


def score(beam: Beam, prompt_len: int, length_penalty: float) -> float:
    return beam.cum_logprob / (max(prompt_len + beam.scored_len, 1) ** length_penalty)


async def search(aengine: AsyncEngine, template: Req, spec: BeamSpec, top_logprobs: int) -> list[ReqOutput]:
    """The ``spec.width`` best sequences for ``template``'s prompt (its fitted ``max_new_tokens``, ``ignore_eos``,
    ``skip_special_tokens``), as finished request outputs; ``top_logprobs``: top entries each output token keeps."""
    engine = aengine.engine
    start = time.perf_counter()
    prompt, sp = template.origin_input_ids, template.sampling_params
    stops = set() if sp.ignore_eos else set(engine.scheduler_config.eos_token_ids)
    k = max(2 * spec.width, top_logprobs)
    live, done = [Beam()], []
    cached = 0
    for step in range(sp.max_new_tokens):
        outs = await _step(aengine, [prompt + b.tokens for b in live], k, f"{template.rid}-beam{step}",
                           template.cache_namespace)
        if step == 0:
            cached = outs[0].cached_tokens
        cands: list[tuple[float, int, Beam, list[tuple[float, int]]]] = []
        for beam, out in zip(live, outs):
            assert out.logprobs_delta is not None
            top = out.logprobs_delta.output_top_logprobs[0] or []
            for lp, tok in top:
                if tok in stops:
                    b = beam.extend(tok, lp, top, keep=spec.include_stop, scored=False)
                    b.finish = FinishReason("stop", matched=tok)
                    done.append(b)
                else:
                    cands.append((beam.cum_logprob + lp, tok, beam, top))
        cands.sort(key=lambda c: -c[0])  # stable: ties keep the earlier beam's order
        live = [beam.extend(tok, cum - beam.cum_logprob, top) for cum, tok, beam, top in cands[: spec.width]]
        if not live:
            break
    for b in live:
        b.finish = FinishReason("length", length=len(b.tokens))
    best = sorted(done + live, key=lambda b: -score(b, len(prompt), spec.length_penalty))[: spec.width]
    best += best[-1:] * (spec.width - len(best))  # max_tokens 0: the empty sequence, once per choice
    took = time.perf_counter() - start
    return [_output(engine.tokenizer, template, b, cached, took, top_logprobs, spec.include_stop) for b in best]


async def _step(aengine: AsyncEngine, prompts: list[list[int]], k: int, rid: str, namespace: int) -> list[ReqOutput]:
    reqs = aengine.engine.expand_requests(prompts, {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True},
                                          True, None, k, [f"{rid}-{i}" for i in range(len(prompts))])
    for r in reqs:  # the call's cache salt holds for its steps
        r.cache_namespace = namespace
    try:
        streams = aengine.submit(reqs, False)
    except ValueError as e:  # its rid is in use by a live request
        raise BeamFailure(400, str(e)) from None
    try:
        outs = list(await asyncio.gather(*(s.result() for s in streams)))
    finally:
        for s in streams:
            if s.final is None:  # cancelled (the client left): stop the step's requests
                aengine.abort(s.rid)
    for out in outs:
        failed = failure_of(out)
        if failed is not None:
            raise BeamFailure(*failed)
    return outs


def _output(tokenizer: Any, template: Req, beam: Beam, cached: int, took: float, top_logprobs: int,
            include_stop: bool) -> ReqOutput:
    fr = beam.finish
    shown = beam.tokens[:-1] if include_stop and fr is not None and fr.type == "stop" else beam.tokens
    text = tokenizer.decode(shown, template.sampling_params.skip_special_tokens)
    lp = Logprobs([], list(beam.logprobs), [], [t[:top_logprobs] for t in beam.tops], top_logprobs)
    return ReqOutput(rid=template.rid, text=text, text_delta=text, output_ids_delta=list(beam.tokens),
                     finish_reason=fr, prompt_tokens=len(template.origin_input_ids),
                     completion_tokens=len(beam.tokens), cached_tokens=cached, e2e_latency=took, logprobs_delta=lp)
