"""The detokenizer stage: request text work on its own thread, off the scheduler (forward) thread.

SGLang and mini-sglang run detokenization as a separate stage after the
scheduler; here it is one thread per engine (``engine-detokenizer``).

Flow: after progress the scheduler thread calls ``Req.on_output``; the engine
turns that into an ``Emission``, a snapshot of counts (no text work, no list
copies), and ``put``s it here. The stage thread turns each emission into one
``ReqOutput`` (``impl/engine/output.py``) holding what is new since the
request's previous one (ids, logprob entries, the text delta) and delivers it
to the request's ``RequestHandle``, in emission order.

Text: every request has one ``IncrementalDetokenizer`` (``req.detok``,
``impl/engine/detokenizer.py``) over its output ids, so each token is decoded
a constant number of times, not the whole output per emission. Ownership: a
request with stop strings has its detokenizer stepped on the scheduler thread,
one token at a time (the scheduler must stop at the exact token; it searches
only the new text plus the longest stop string's tail) and the emission carries
the cumulative text; any other request's detokenizer is stepped only here. At
the finish the stage alone touches it (``finish()`` flushes a held partial
character), then trims at the stop string.

Streamed ``text`` is stable: a trailing prefix of a stop string is held back
(a partial UTF-8 character already is, by the detokenizer), so every ``text``
is a prefix of the next and ``text_delta`` never retracts.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from impl.engine.output import Logprobs, ReqOutput
from impl.engine.req import FinishReason
from impl.engine.request_handle import RequestHandle

logger = logging.getLogger("impl.engine")


@dataclass(frozen=True)
class Emission:
    """What the scheduler thread hands over for one output of one request."""

    handle: RequestHandle
    num_output: int  # output ids at the time of the emission
    num_input_logprobs: int
    finish_reason: FinishReason | None
    time: float  # perf_counter: the finish time, or when the emission was made
    text: str | None  # cumulative text when the scheduler thread owns the detokenizer (stop strings), else None
    spec: tuple[int, float | None] | None = None  # (spec_verify_ct, spec_accept_length) with speculative decoding


def hold_stop_prefix(text: str, stops: Sequence[str]) -> str:
    """``text`` less its longest suffix that is a proper prefix of a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return text[: len(text) - hold] if hold else text


def build_output(em: Emission) -> ReqOutput:
    """The ReqOutput of one emission (detokenizer thread)."""
    h = em.handle
    req = h.req
    sp = req.sampling_params
    detok = req.detok
    owned_here = not sp.stop  # else the scheduler thread steps it (see the module docstring)
    if owned_here and em.num_output > h.consumed:
        detok.step(req.output_ids[h.consumed : em.num_output])
        h.consumed = em.num_output
    if em.finish_reason is not None:
        detok.finish()
        text = detok.text
        if req.stop_text_pos is not None and not sp.no_stop_trim:
            text = text[: req.stop_text_pos]
    else:
        text = detok.text if owned_here else em.text
        assert text is not None  # with stop strings the scheduler thread sends the cumulative text
        text = hold_stop_prefix(text, sp.stop)
    if text.startswith(h.sent_text):
        delta = text[len(h.sent_text) :]
        h.sent_text = text
    else:  # only a final text trimmed at a stop string matched before min_new_tokens allowed it
        delta = ""
    # what is new since this request's previous emission (the lists only grow; slices copy the new part)
    n, ni, k, ki = em.num_output, em.num_input_logprobs, h.sent_ids, h.sent_input_logprobs
    logprobs = None
    if req.return_logprob:
        logprobs = Logprobs(
            input_token_logprobs=req.input_token_logprobs[ki:ni],
            output_token_logprobs=req.output_token_logprobs[k:n],
            input_top_logprobs=req.input_top_logprobs[ki:ni],
            output_top_logprobs=req.output_top_logprobs[k:n],
            top_logprobs_num=req.top_logprobs_num,
            input_token_ranks=None if req.input_token_ranks is None else req.input_token_ranks[ki:ni],
        )
    h.sent_ids, h.sent_input_logprobs = n, ni
    first = req.first_token_time
    return ReqOutput(
        rid=req.rid,
        text=text,
        text_delta=delta,
        output_ids_delta=req.output_ids[k:n],
        finish_reason=em.finish_reason,
        prompt_tokens=len(req.origin_input_ids),
        completion_tokens=n,
        cached_tokens=req.cached_tokens,
        e2e_latency=em.time - req.created_time,
        ttft=None if first is None else first - req.created_time,
        logprobs_delta=logprobs,
        spec_verify_ct=em.spec[0] if em.spec else 0,
        spec_accept_length=em.spec[1] if em.spec else None,
    )


class DetokenizerStage:
    """One daemon thread that builds and delivers ReqOutputs; started on first use, ``stop()`` ends it."""

    def __init__(self, name: str = "engine-detokenizer", on_failed: Callable[[str], None] | None = None):
        self.name = name
        self.on_failed = on_failed  # called with the rid of a request whose output could not be built
        self._queue: "queue.Queue[Emission | None]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, em: Emission) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put(em)

    def drain(self) -> None:
        """Block until every emission put so far has been delivered."""
        self._queue.join()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
        thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            em = self._queue.get()
            try:
                if em is None:
                    return
                if self._deliver(em) and self.on_failed is not None:
                    self.on_failed(em.handle.rid)
            except Exception:  # noqa: BLE001 - a failing hook must not stop every later output
                logger.exception("Delivering an output of request %s failed", em.handle.rid if em else None)
            finally:
                self._queue.task_done()

    @staticmethod
    def _deliver(em: Emission) -> bool:
        """Deliver one output; True when it could not be built (the request got an error final output instead,
        and the caller stops it in the scheduler, which frees its KV: fault_isolation.py's promise)."""
        try:
            out = build_output(em)
            failed = False
        except Exception as e:  # noqa: BLE001 - a failed output must not hang its client
            logger.exception("Building the output of request %s failed", em.handle.rid)
            req = em.handle.req
            msg = f"internal error during output building (detokenization): {type(e).__name__}: {e}"
            out = ReqOutput(rid=req.rid, text=em.handle.sent_text, text_delta="",
                            output_ids_delta=req.output_ids[em.handle.sent_ids : em.num_output],
                            finish_reason=FinishReason("abort", message=msg, status_code=500),
                            prompt_tokens=len(req.origin_input_ids), completion_tokens=em.num_output,
                            cached_tokens=req.cached_tokens, e2e_latency=em.time - req.created_time)
            failed = not em.handle.done.is_set() and em.finish_reason is None
        em.handle.deliver(out)
        return failed
