"""The scheduler's settings and its decode-step timing: plain data, imported by the scheduler, the engine and
the decode-worker seam (``impl/engine/speculative/base.py``) without importing the scheduler itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    max_running_requests: int
    chunked_prefill_size: int  # -1: chunking off
    max_prefill_tokens: int
    max_req_len: int  # prompt + output tokens one request may reach
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int | None = None
    stream_interval: int = 1
    schedule_policy: str = "fcfs"
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    check_integrity_when_idle: bool = True

    @property
    def chunking(self) -> bool:
        return self.chunked_prefill_size > 0

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunking else self.max_prefill_tokens


@dataclass
class DecodeStepTimes:
    """Wall time of pure decode steps, split into the model forward and everything else on the
    scheduler thread (scheduling, batch building, sampling over the vocabulary, stop checks): what the
    large-vocabulary work costs per step (``/get_server_info`` ``decode_step_times``)."""

    steps: int = 0
    rows: int = 0
    total_s: float = 0.0
    forward_s: float = 0.0

    def add(self, rows: int, total_s: float, forward_s: float) -> None:
        self.steps += 1
        self.rows += rows
        self.total_s += total_s
        self.forward_s += forward_s

    def as_dict(self) -> dict[str, float]:
        n = max(self.steps, 1)
        return {"steps": self.steps, "rows": self.rows, "total_s": self.total_s, "forward_s": self.forward_s,
                "outside_model_ms_per_step": 1e3 * (self.total_s - self.forward_s) / n,
                "forward_ms_per_step": 1e3 * self.forward_s / n}
