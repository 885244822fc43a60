"""The scheduler's inbox: typed messages from any thread to the scheduler thread.

``Engine.submit`` / ``Engine.abort`` (any thread) put them; the scheduler takes them all at the start of
each step (``Scheduler.process_inbox``), on its own thread, so the queues it owns are never shared.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Iterator

from impl.engine.req import Req


@dataclass(frozen=True)
class AddRequest:
    """A validated request joins the waiting queue."""

    req: Req


@dataclass(frozen=True)
class AbortRequest:
    """Abort the request ``rid`` wherever it is (None: every request)."""

    rid: str | None


InboxMessage = AddRequest | AbortRequest


class Inbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[InboxMessage] = queue.SimpleQueue()

    def put(self, msg: InboxMessage) -> None:
        self._queue.put(msg)

    def empty(self) -> bool:
        return self._queue.empty()

    def drain(self) -> Iterator[InboxMessage]:
        """Every message, including those put while the caller handles earlier ones."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return
