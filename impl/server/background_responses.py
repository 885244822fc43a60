"""The Responses API's background responses (``background: true``): generated after the request is answered.

OpenAI's background mode: ``POST /v1/responses`` with ``background: true`` answers at once with the response
object, ``status: "queued"``, and the generation goes on without the client; ``GET /v1/responses/{id}`` shows its
status (``queued`` until the scheduler admits it, ``in_progress``, then ``completed`` / ``incomplete`` /
``failed`` / ``cancelled``) and, once finished, the whole response; ``POST /v1/responses/{id}/cancel`` stops it.
Every background response records its stream events (the same events a streamed foreground response sends, each
with its ``sequence_number``), so ``background`` with ``stream: true`` answers with the events as they come, and
``GET /v1/responses/{id}?stream=true&starting_after=N`` replays them after event N and follows the live ones: a
client that lost its connection resumes where it left off (the client leaving never stops the generation).

A run lives here from its POST until it finishes; then its response (with its events) is in the response
store like any other (``response_store.py``), failed and cancelled ones too. Unfinished runs are at most
``YOCO_RESPONSES_BACKGROUND_MAX`` (a background request holds no connection, so nothing else bounds how many a
client leaves queued): one more is a 429 naming the variable.

Single-threaded: every method runs on the event loop.
Invariants (``check_integrity``): every run is unfinished, keyed by its response's id, at most ``limit`` of them;
event i of a run has ``sequence_number`` i.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from impl.envs import envs
from impl.server.async_engine import RequestStream
from impl.server.errors import APIError

TERMINAL = ("completed", "incomplete", "failed", "cancelled")
CANCEL_WAIT_S = 30.0  # a cancel waits this long for the engine to stop the request before it answers


@dataclass
class BackgroundRun:
    """One background response while it runs."""

    response: dict[str, Any]  # the latest response object of its events (queued, in progress, then finished)
    input_items: list[dict[str, Any]]  # the request's input items, as input_items lists them
    stream: RequestStream  # the engine request
    events: list[bytes] = field(default_factory=list)  # the events so far, SSE-encoded; event i is sequence i
    ended: bool = False  # its events have ended (set before the last wake-up)
    task: asyncio.Task | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) at every new event or end

    @property
    def id(self) -> str:
        return self.response["id"]

    def record(self, event: dict[str, Any], encoded: bytes) -> None:
        """Append an event (its response object, where it carries one, becomes the latest) and wake followers."""
        if "response" in event:
            self.response = event["response"]
        self.events.append(encoded)
        self.notify()

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def now(self) -> dict[str, Any]:
        """The response object as GET shows it: until it finishes, ``queued`` while the request waits for the
        scheduler, ``in_progress`` once admitted (its events say ``in_progress`` from the start, as a foreground
        stream's do)."""
        if self.response["status"] in TERMINAL:
            return self.response
        return {**self.response, "status": "in_progress" if self.stream.req.admitted_once else "queued"}

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The events after sequence number ``after``, then each new one as it comes, until the run ends."""
        i = after + 1
        while True:
            changed = self._changed
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.ended:
                return
            await changed.wait()


async def replay(events: Sequence[bytes], after: int) -> AsyncIterator[bytes]:
    """A finished response's kept events after sequence number ``after``."""
    for e in events[after + 1:]:
        yield e


class BackgroundResponses:
    """The unfinished background responses of this server, by response id."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError(f"YOCO_RESPONSES_BACKGROUND_MAX must be >= 0, got {limit}")
        self.limit = limit
        self._runs: dict[str, BackgroundRun] = {}

    @staticmethod
    def from_env() -> BackgroundResponses:
        return BackgroundResponses(envs.YOCO_RESPONSES_BACKGROUND_MAX.get())

    def check_room(self) -> None:
        """A 429 when ``limit`` background responses are unfinished already."""
        if self.limit == 0:
            raise APIError(400, "this server runs no background responses (YOCO_RESPONSES_BACKGROUND_MAX=0); send "
                                "background false", "background")
        if len(self._runs) >= self.limit:
            raise APIError(429, f"{len(self._runs)} background responses are unfinished, the most this server runs "
                                f"(YOCO_RESPONSES_BACKGROUND_MAX={self.limit}); wait for some to finish (GET "
                                "/v1/responses/{id}) or cancel them", "background")

    def start(self, run: BackgroundRun, events: AsyncIterator[dict[str, Any]], encode: Callable[[dict], bytes],
              on_end: Callable[[BackgroundRun, BaseException | None], None]) -> None:
        """Drive ``events`` into ``run`` on a task of its own; ``on_end(run, error)`` once they end (``error``: what
        they raised, None when they ended), before the run leaves this registry. The caller checked the room
        (``check_room``) before it submitted the request."""

        async def drive() -> None:
            error: BaseException | None = None
            try:
                async for ev in events:
                    run.record(ev, encode(ev))
            except asyncio.CancelledError as e:  # server shutdown: the engine stops too
                error = e
                raise
            except Exception as e:  # noqa: BLE001 - the engine died: the response fails, the server lives on
                error = e
            finally:
                try:
                    on_end(run, error)
                finally:
                    self._runs.pop(run.id, None)
                    run.ended = True
                    run.notify()

        self._runs[run.id] = run
        run.task = asyncio.get_running_loop().create_task(drive(), name=f"background {run.id}")

    def get(self, response_id: str) -> BackgroundRun | None:
        return self._runs.get(response_id)

    async def cancel(self, run: BackgroundRun, abort: Callable[[str], None]) -> None:
        """Stop ``run``'s request and wait (at most ``CANCEL_WAIT_S``) for its run to end as cancelled."""
        abort(run.stream.rid)
        assert run.task is not None
        try:
            await asyncio.wait_for(asyncio.shield(run.task), CANCEL_WAIT_S)
        except asyncio.TimeoutError:
            pass  # (the engine is paused or busy: the run ends as cancelled when it gets to the abort)

    def stats(self) -> dict[str, int]:
        return {"background_running": len(self._runs), "background_max": self.limit}

    def check_integrity(self) -> None:
        if len(self._runs) > self.limit:
            raise AssertionError(f"background responses: {len(self._runs)} unfinished, limit {self.limit}")
        for rid, run in self._runs.items():
            if run.id != rid:
                raise AssertionError(f"background responses: run {rid!r} holds response {run.id!r}")
            for i, e in enumerate(run.events):
                seq = json.loads(e.decode()[len("data: "):])["sequence_number"]
                if seq != i:
                    raise AssertionError(f"background response {rid}: event {i} has sequence_number {seq}")
