"""Where each unfinished request of the scheduler is: waiting, running, or the one being prefilled in chunks.

One object that the scheduler's units share (admission, decode and retraction, output, fault isolation),
so a request leaves every queue through one method (``remove``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from impl.engine.req import Req


@dataclass
class ReqQueues:
    waiting: deque[Req] = field(default_factory=deque)  # not admitted (or retracted: at the front), in order
    running: list[Req] = field(default_factory=list)  # prefilled, decoding; oldest first (retraction takes the newest)
    chunked_req: Req | None = None  # the one request whose prompt is prefilled over several forwards
    # Requests whose prompt's last chunk is in the forward being run (admitted whole this step, or the chunked
    # one's last chunk): they hold KV and sit in no other queue until the forward's output joins them to
    # ``running``; empty between steps. Without it a failure in the middle of a step would miss them.
    prefilling: list[Req] = field(default_factory=list)

    @property
    def live(self) -> list[Req]:
        """The requests that hold KV: running, the chunked one, and those whose prefill is in flight."""
        return self.running + ([self.chunked_req] if self.chunked_req else []) + self.prefilling

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req or self.prefilling)

    def remove(self, req: Req) -> None:
        """Take ``req`` out of whichever queue holds it (none: nothing happens)."""
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
