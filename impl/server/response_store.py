"""The Responses API's stored responses: what ``previous_response_id`` continues and
``GET`` / ``DELETE /v1/responses/{id}`` (and ``.../input_items``) read.

OpenAI stores a response unless the request says ``store: false``; so does this server, in memory, per server
process (a ``--dp-size`` front asks its replicas which one holds an id), within a byte budget
(``YOCO_RESPONSES_STORE_MB``, default 256; 0 stores nothing, and a request's ``store: true`` is then a 400). When a
new response does not fit, the least recently used ones (stored, continued or read) are dropped; a request naming
a dropped id gets the same 404 as an unknown one, which says so. vLLM keeps its store behind
``VLLM_ENABLE_RESPONSES_API_STORE`` and never drops an entry.

Each entry holds the response object as it was answered (a background response: as it finished, with its stream
events), its input items (each with an id, as the
``input_items`` list shows them) and the conversation through its output as chat messages: the previous
response's conversation, this input's messages, then the output as one assistant message (its text and its
function calls). ``instructions`` are not part of it: OpenAI's rule, a follow-up's own instructions (or none)
take their place. An entry's size is its JSON's length; a conversation carries its predecessors', so a long chain
of follow-ups uses the budget quadratically, bounded by the context length each request must fit.

Invariants (``check_integrity``): ``used`` is the sum of the entries' sizes and at most ``budget``.
Thread-safe: request bodies are built on the intake pool's threads, the answers stored on the event loop.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from impl.envs import envs


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as answered (status, output, usage ...)
    input_items: list[dict[str, Any]]  # the request's input items, each with its id, in order
    conversation: list[dict[str, Any]]  # chat messages through this response's output, without instructions
    # a background response's stream events, SSE-encoded, event i with sequence_number i (replayed by GET
    # ?stream=true; background_responses.py); () for a foreground response
    events: tuple[bytes, ...] = ()
    nbytes: int = field(default=0, compare=False)

    @staticmethod
    def of(response: dict[str, Any], input_items: list[dict[str, Any]], conversation: list[dict[str, Any]],
           events: tuple[bytes, ...] = ()) -> StoredResponse:
        size = len(json.dumps([response, input_items, conversation], ensure_ascii=False).encode())
        return StoredResponse(response, input_items, conversation, events, size + sum(len(e) for e in events))


class ResponseStore:
    """Stored responses by id, least recently used first, within ``budget`` bytes."""

    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError(f"a response store's budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self.used = 0
        self.dropped = 0  # entries dropped for room since startup
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def from_env() -> ResponseStore:
        return ResponseStore(envs.YOCO_RESPONSES_STORE_MB.get() << 20)

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def put(self, entry: StoredResponse) -> bool:
        """Store ``entry`` under its response's id, dropping the least recently used entries for room.
        False (nothing stored, nothing dropped) when it alone is larger than the budget."""
        rid = entry.response["id"]
        with self._lock:
            if entry.nbytes > self.budget:
                return False
            old = self._entries.pop(rid, None)
            if old is not None:
                self.used -= old.nbytes
            while self.used + entry.nbytes > self.budget:
                _, gone = self._entries.popitem(last=False)
                self.used -= gone.nbytes
                self.dropped += 1
            self._entries[rid] = entry
            self.used += entry.nbytes
            return True

    def get(self, rid: str) -> StoredResponse | None:
        """The entry (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(rid)
            if entry is not None:
                self._entries.move_to_end(rid)
            return entry

    def delete(self, rid: str) -> bool:
        with self._lock:
            entry = self._entries.pop(rid, None)
            if entry is None:
                return False
            self.used -= entry.nbytes
            return True

    def not_found(self, rid: str) -> str:
        """The message of a 404 for ``rid``."""
        why = (f"this server stores responses in memory, within YOCO_RESPONSES_STORE_MB={self.budget >> 20} "
               f"(it has dropped {self.dropped} for room since it started), and not across restarts"
               if self.enabled else "this server stores no responses (YOCO_RESPONSES_STORE_MB=0)")
        return f"Response with id '{rid:.200}' not found: {why}"

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"responses": len(self._entries), "bytes": self.used, "budget_bytes": self.budget,
                    "dropped": self.dropped}

    def check_integrity(self) -> None:
        with self._lock:
            total = sum(e.nbytes for e in self._entries.values())
            if total != self.used or self.used > self.budget:
                raise AssertionError(f"response store: {self.used} bytes counted, {total} held, budget {self.budget}")
            for rid, e in self._entries.items():
                if e.response.get("id") != rid:
                    raise AssertionError(f"response store: entry {rid!r} holds response {e.response.get('id')!r}")
