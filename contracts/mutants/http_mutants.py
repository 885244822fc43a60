"""Mutants of the HTTP server: each is a real server with one deliberate bug.

A mutant subject's ``base_url(argv)`` starts (through ``contracts.adapters.impl_http``)
``python -m contracts.mutants.http_mutants NAME *argv``, which applies the
mutant's patch to ``impl`` in that process and then runs the normal launcher.
The implementation carries no test hooks. Only one mutant server runs at a
time (each costs a process start); fast-prefill mutants break only the
flag-on launch and use the normal server for the flag-off one.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from contracts.mutants import mutant
from contracts.subject import SubjectWrapper

FLAG = "--kv-sharing-fast-prefill"
_BREAKS: dict[str, Callable[[], None]] = {}


def breaks(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        _BREAKS[name] = fn
        return fn

    return deco


class HttpMutant(SubjectWrapper):
    """Serves every launch line (or only those with ``ONLY_WITH``) from a mutant server."""

    ONLY_WITH: str | None = None

    def base_url(self, argv):
        if self.ONLY_WITH is not None and self.ONLY_WITH not in argv:
            return self.inner.base_url(argv)
        from contracts.adapters.impl_http import base_url

        return base_url(argv, mutant=type(self).__name__)


def _set(module: Any, name: str, value: Any) -> None:
    setattr(module, name, value)


# ---------------------------------------------------------------- the mutants


@mutant("HTTP-STREAM-EQUALS-NONSTREAM")
class StreamDropsLastChar(HttpMutant):
    """Streams hold back one character too many, even in the final chunk."""


@breaks("StreamDropsLastChar")
def _stream_drops_last_char() -> None:
    import dataclasses

    from impl.engine import detokenizer_stage

    orig = detokenizer_stage.build_output

    def build_output(em):
        out = orig(em)
        if em.handle.stream and out.finished and out.text:
            out = dataclasses.replace(out, text=out.text[:-1], text_delta=out.text_delta[:-1])
        return out

    _set(detokenizer_stage, "build_output", build_output)


@mutant("HTTP-ONE-FINISH-REASON")
class FinishReasonOnEveryChunk(HttpMutant):
    """OpenAI stream chunks all carry a finish_reason, not only each choice's last."""


@breaks("FinishReasonOnEveryChunk")
def _finish_reason_on_every_chunk() -> None:
    from impl.server import openai_api

    orig = openai_api.delta_chunk

    def delta_chunk(*a, **kw):
        c = orig(*a, **kw)
        if c is not None and c["finish_reason"] is None:
            c["finish_reason"] = "length"
        return c

    _set(openai_api, "delta_chunk", delta_chunk)


@mutant("HTTP-USAGE-EXACT")
class UsageCountsPromptPerChoice(HttpMutant):
    """usage.prompt_tokens counts the prompt once per choice (n > 1 over-reports)."""


@breaks("UsageCountsPromptPerChoice")
def _usage_prompt_per_choice() -> None:
    from impl.server import openai_api

    def usage(sub, finals):
        prompt = sum(f.prompt_tokens for f in finals)
        completion = sum(f.completion_tokens for f in finals)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    _set(openai_api, "usage", usage)


@mutant("HTTP-BAD-INPUT-400")
class BadInputIsServerError(HttpMutant):
    """Client errors are reported as HTTP 500."""


@breaks("BadInputIsServerError")
def _bad_input_500() -> None:
    from impl.server import errors

    orig = errors.error_response
    _set(errors, "error_response", lambda status, message, param=None: orig(500 if status == 400 else status, message, param))


@mutant("HTTP-BAD-INPUT-400")
class RejectsRouterUnknownModel(HttpMutant):
    """model 'unknown' (sglang-router's stand-in for a missing model) is refused as a wrong model name."""


@breaks("RejectsRouterUnknownModel")
def _rejects_unknown_model() -> None:
    from impl.server import app

    _set(app, "ROUTER_UNKNOWN_MODEL", "\x00no model name matches this")


@mutant("HTTP-CONCURRENT-STREAMS")
class SerializesStreams(HttpMutant):
    """Streamed /generate requests run one at a time (a global lock from submission to the stream's end)."""


@breaks("SerializesStreams")
def _serializes_streams() -> None:
    import asyncio

    from impl.server import generate_api

    orig = generate_api.generate_response
    locks: dict[str, asyncio.Lock] = {}

    async def generate_response(request, aengine, sub, stream):
        if not stream:
            return await orig(request, aengine, sub, stream)
        lock = locks.setdefault("l", asyncio.Lock())
        await lock.acquire()
        try:
            resp = await orig(request, aengine, sub, stream)
        except BaseException:
            lock.release()
            raise
        inner = resp.body_iterator

        async def body():
            try:
                async for chunk in inner:
                    yield chunk
            finally:
                lock.release()

        resp.body_iterator = body()
        return resp

    _set(generate_api, "generate_response", generate_response)


@mutant("HTTP-DISCONNECT-ABORTS")
class IgnoresDisconnect(HttpMutant):
    """A disconnected client's request keeps running to the end."""


@breaks("IgnoresDisconnect")
def _ignores_disconnect() -> None:
    from impl.server import generate_api, openai_api

    _set(generate_api, "abort_unfinished", lambda streams, abort: None)
    _set(openai_api, "abort_unfinished", lambda streams, abort: None)


@mutant("HTTP-METRICS")
class MetricsUndercountTokens(HttpMutant):
    """The generation-token counter misses each request's last token."""


@breaks("MetricsUndercountTokens")
def _metrics_undercount() -> None:
    from impl.server.metrics import ServerMetrics

    orig = ServerMetrics.observe_finished

    def observe(self, prompt_tokens, completion_tokens, *a, **kw):
        return orig(self, prompt_tokens, max(0, completion_tokens - 1), *a, **kw)

    _set(ServerMetrics, "observe_finished", observe)


@mutant("HTTP-SERVER-INFO-FLAG")
class ServerInfoHidesFlag(HttpMutant):
    """/get_server_info reports kv_sharing_fast_prefill=false although the server runs with it."""

    ONLY_WITH = FLAG


@breaks("ServerInfoHidesFlag")
def _server_info_hides_flag() -> None:
    from impl.engine.engine import Engine

    orig = Engine.get_server_info

    def info(self):
        out = orig(self)
        out["kv_sharing_fast_prefill"] = False
        return out

    _set(Engine, "get_server_info", info)


@mutant("HTTP-PARITY-FAST-PREFILL", "HTTP-PARITY-BATCHED", "HTTP-PROMPT-LOGPROBS-FAST-PREFILL")
class FastPrefillShiftsLogits(HttpMutant):
    """With fast prefill on, the prefill forward returns logits shifted by one token id."""

    ONLY_WITH = FLAG


@breaks("FastPrefillShiftsLogits")
def _fast_prefill_shifts_logits() -> None:
    from impl.engine.model_runner import ModelRunner

    orig = ModelRunner.forward

    def forward(self, fb):
        out = orig(self, fb)
        if fb.fast_prefill:
            out.logits = out.logits.roll(1, dims=-1)
        return out

    _set(ModelRunner, "forward", forward)


def _shift_logits(when: Callable[[Any], bool]) -> None:
    """Prefill / decode forwards for which ``when(forward_batch)`` holds return logits shifted by one token id."""
    from impl.engine.model_runner import ModelRunner

    orig = ModelRunner.forward

    def forward(self, fb):
        out = orig(self, fb)
        if when(fb):
            out.logits = out.logits.roll(1, dims=-1)
        return out

    _set(ModelRunner, "forward", forward)


@mutant("HTTP-PARITY-ONE-BY-ONE", "HTTP-PARITY-BATCHED")
class BatchedFastPrefillShiftsLogits(HttpMutant):
    """With fast prefill on, a prefill forward of more than one request returns logits shifted by one token id
    (a request alone is right)."""

    ONLY_WITH = FLAG


@breaks("BatchedFastPrefillShiftsLogits")
def _batched_fast_prefill_shifts_logits() -> None:
    _shift_logits(lambda fb: fb.fast_prefill and fb.batch_size > 1)


@mutant("HTTP-PARITY-EDGE-BATCHES")
class CrossMetadataOmitsPrefixHttp(HttpMutant):
    """With fast prefill on, the back half's attention metadata lists only this pass's new tokens as keys, not
    the cached prefix (a later chunk or a prefix-cache hit: the selected rows miss part of their context)."""

    ONLY_WITH = FLAG


@breaks("CrossMetadataOmitsPrefixHttp")
def _cross_metadata_omits_prefix() -> None:
    from contracts.mutants.engine_mutants import drop_cached_prefix
    from impl.attention.triton_backend import TritonAttnBackend

    orig = TritonAttnBackend.init_cross_decoder_metadata

    def without_prefix(self, fb, rows, rows_per_req):
        orig(self, fb, rows, rows_per_req)
        drop_cached_prefix(self.cross_metadata, fb)

    _set(TritonAttnBackend, "init_cross_decoder_metadata", without_prefix)


@mutant("HTTP-GREEDY-MATCHES-TRANSFORMERS")
class LogitsShifted(HttpMutant):
    """Every forward (prefill and decode, flag on or off) returns logits shifted by one token id."""


@breaks("LogitsShifted")
def _logits_shifted() -> None:
    _shift_logits(lambda fb: True)


@mutant("HTTP-SEEDED-SAMPLING-REPEATS")
class SeedIgnored(HttpMutant):
    """A request's seed is ignored: every request samples from a generator seeded at random."""


@breaks("SeedIgnored")
def _seed_ignored() -> None:
    import random

    import torch

    from impl.engine import engine

    orig = engine.expand_requests

    def expand(*a, **kw):
        reqs = orig(*a, **kw)
        for r in reqs:
            r.generator = torch.Generator().manual_seed(random.getrandbits(62))
        return reqs

    _set(engine, "expand_requests", expand)


@mutant("HTTP-KV-FREED")
class FinishedRequestsKeepKv(HttpMutant):
    """A finished request's KV slots are neither cached nor freed (its req_to_token row is)."""


@breaks("FinishedRequestsKeepKv")
def _finished_requests_keep_kv() -> None:
    from impl.engine.kv_lifecycle import KVLifecycle

    def release(self, req):
        if req.req_pool_idx is not None:
            if self.tree is not None:
                self.tree.dec_lock_ref(req.last_node, req.swa_lock)
            self._forget(req)

    _set(KVLifecycle, "release", release)


@mutant("HTTP-PREFIX-HIT-INVARIANT")
class PrefixHitLastSlotWrong(HttpMutant):
    """On a prefix-cache hit the last cached position reads the first position's KV slot."""


@breaks("PrefixHitLastSlotWrong")
def _prefix_hit_last_slot_wrong() -> None:
    from impl.engine.kv_lifecycle import KVLifecycle

    orig = KVLifecycle.admit

    def admit(self, req):
        ok = orig(self, req)
        if ok and req.prefix_len > 1:
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
            row[req.prefix_len - 1] = row[0]
        return ok

    _set(KVLifecycle, "admit", admit)


@mutant("HTTP-STRUCTURED-OUTPUT-VALID")
class GrammarMaskOneTokenLate(HttpMutant):
    """Each constrained request samples with the token bitmask of the step before (its first token unmasked)."""


@breaks("GrammarMaskOneTokenLate")
def _grammar_mask_one_token_late() -> None:
    from impl.engine.output_processor import OutputProcessor

    orig = OutputProcessor.grammar_masks
    previous: dict[int, Any] = {}

    def late(self, reqs):
        masks = orig(self, reqs)
        out = [previous.get(id(r)) for r in reqs]
        previous.update({id(r): m.clone() for r, m in zip(reqs, masks) if m is not None})
        return out

    _set(OutputProcessor, "grammar_masks", late)


@breaks("InjectedFaults")
def _injected_faults() -> None:
    """Not a mutant: the fault-suite server (requests whose rid names a stage fail there; contracts/fault_injection.py)."""
    from contracts.fault_injection import install

    install()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in _BREAKS:
        print(f"usage: python -m contracts.mutants.http_mutants NAME [launch_server args]; NAME in {sorted(_BREAKS)}",
              file=sys.stderr)
        return 2
    _BREAKS[argv[0]]()
    from impl.launch_server import main as launch

    return launch(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
