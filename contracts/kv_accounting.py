"""One engine run whose KV accounting must balance: shared by the engine and speculative-decoding contracts."""

from __future__ import annotations

from typing import Any, Sequence

from contracts.base import require, violation
from contracts.subject import GenRequest


def generate_freeing_kv(subject: Any, argv: list[str], reqs: Sequence[GenRequest], what: str) -> Any:
    """``subject.generate(argv, reqs)``, failing the running contract when the engine's own KV integrity check
    trips during the run or when, after every request ended, fewer KV slots are usable than the pool holds."""
    try:
        out = subject.generate(argv, list(reqs))
    except AssertionError as e:  # the engine's own KV integrity check tripped during the run
        raise violation(f"{what}: the engine's KV accounting failed during the run: {e}") from e
    require(
        out.kv_available_after == out.kv_capacity,
        f"{what}: after all requests ended {out.kv_available_after} of {out.kv_capacity} KV slots are usable; "
        "the rest leaked",
    )
    return out
