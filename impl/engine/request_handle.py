"""RequestHandle: one submitted request as its caller sees it.

``Engine.submit`` returns one handle per request. The detokenizer stage
delivers the request's ``ReqOutput`` objects to ``queue`` in order (every
``stream_interval`` tokens when streaming, and always the final one, whose
``finish_reason`` is set); ``final`` and ``done`` are set with the final output.
Two optional hooks run on the detokenizer thread: ``on_finish(req, out)`` just
before the final output becomes visible (metrics count a request before its
client sees it), ``wake()`` after each output is queued (an event loop's wake-up).
``consumed``, ``sent_text``, ``sent_ids`` and ``sent_input_logprobs`` are the stage's per-request state
(each output carries what is new since the previous one).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from impl.engine.output import ReqOutput
from impl.engine.req import Req


@dataclass(eq=False)
class RequestHandle:
    req: Req
    stream: bool
    on_finish: Callable[[Req, ReqOutput], None] | None = None
    wake: Callable[[], None] | None = None
    queue: "queue.Queue[ReqOutput]" = field(default_factory=queue.Queue)
    final: ReqOutput | None = None
    done: threading.Event = field(default_factory=threading.Event)
    # detokenizer-thread state: output ids fed to req.detok, text / output ids / prompt logprobs already delivered
    consumed: int = 0
    sent_text: str = ""
    sent_ids: int = 0
    sent_input_logprobs: int = 0

    @property
    def rid(self) -> str:
        return self.req.rid

    def result(self) -> ReqOutput:
        """The final output (call once ``done`` is set)."""
        assert self.final is not None, f"request {self.rid} has not finished"
        return self.final

    def deliver(self, out: ReqOutput) -> None:
        if self.done.is_set():  # nothing follows the final output
            return
        if out.finished:
            if self.on_finish is not None:
                self.on_finish(self.req, out)
            self.final = out
        self.queue.put(out)
        if out.finished:
            self.done.set()
        if self.wake is not None:
            self.wake()
