"""Seed 000's benchmark scenarios (PR-C): chat 1k/1k and summarisation 8k/1k, 80 prompts, warmup 2, seed 1.

``scale`` multiplies both lengths (at least one token each) so the scenarios fit small
machines; every report prints the scale it ran at.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    name: str
    input_len: int
    output_len: int
    num_prompts: int = 80
    warmup_requests: int = 2
    seed: int = 1
    range_ratio: float = 1.0

    def scaled(self, scale: float) -> "Scenario":
        if not 0 < scale <= 1:
            raise ValueError(f"--scale must be in (0, 1], got {scale}")
        return Scenario(self.name, max(1, round(self.input_len * scale)), max(1, round(self.output_len * scale)),
                        self.num_prompts, self.warmup_requests, self.seed, self.range_ratio)

    @property
    def label(self) -> str:
        return f"{self.name} {self.input_len}/{self.output_len}"


PRESETS: dict[str, Scenario] = {
    "chat": Scenario("chat", 1024, 1024),
    "summ": Scenario("summ", 8192, 1024),
}
