"""LoadView: the engine's load, read without touching scheduler or runner internals.

``Engine.load()`` returns one. It is read from any thread while the scheduler
thread runs: plain reads of counters, so the fields may be one step apart from
each other, never torn. Used by ``/get_server_info``, ``/metrics``, the
graceful shutdown and the contract adapters.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadView:
    num_running_reqs: int  # in the running batch (the chunked-prefill request included)
    num_waiting_reqs: int  # queued, not yet admitted (retracted ones included)
    kv_tokens_total: int  # usable KV slots (slot 0, the pad slot, excluded); the full-attention pool's
    kv_tokens_available: int  # free plus evictable (cached prefixes no request holds)
    max_running_requests: int
    chunked_prefill_size: int  # -1: chunking off
    max_prefill_tokens: int
    max_req_len: int  # prompt + output tokens one request may reach
    # the hybrid pool's sliding-window budget (0 / 0 with one pool)
    swa_tokens_total: int = 0
    swa_tokens_available: int = 0

    @property
    def kv_tokens_used(self) -> int:
        """Slots held by requests or locked prefixes (neither free nor evictable)."""
        return max(0, self.kv_tokens_total - self.kv_tokens_available)

    @property
    def token_usage(self) -> float:
        """kv_tokens_used / kv_tokens_total (SGLang's ``token_usage``)."""
        return self.kv_tokens_used / self.kv_tokens_total if self.kv_tokens_total else 0.0

    @property
    def num_reqs(self) -> int:
        return self.num_running_reqs + self.num_waiting_reqs
