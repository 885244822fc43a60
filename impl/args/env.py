"""Environment switches the argument rules and the KV pool read (our own ``YOCO_`` prefix, SGLang's ``envs`` shape).

``envs.YOCO_DISABLE_LAZY_COMPACTION.get()`` reads the variable at call time, so a
test (or ``Subject.check(env=...)``) can set it per check. A value that is not a
boolean is a ValueError naming the variable, never a silent False.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_PREFIX = "YOCO_"
_TRUE = ("true", "1", "yes", "y")
_FALSE = ("false", "0", "no", "n", "")


@dataclass(frozen=True)
class EnvBool:
    name: str
    default: bool = False

    def get(self) -> bool:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(
            f"environment variable {self.name}={raw!r} is not a boolean; use one of "
            f"{', '.join(_TRUE)} or {', '.join(v for v in _FALSE if v)} (or unset it)."
        )

    def is_set(self) -> bool:
        return self.name in os.environ


@dataclass(frozen=True)
class EnvInt:
    name: str
    default: int
    minimum: int = 0

    def get(self) -> int:
        raw = os.environ.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
        if value is None or value < self.minimum:
            raise ValueError(f"environment variable {self.name}={raw!r} is not an integer >= {self.minimum}; "
                             f"set one (default {self.default}) or unset it.")
        return value


class envs:
    """Every environment switch of the argument rules, by name."""

    # The unified memory pool compacts lazily; PD disaggregation's whole-envelope
    # transfer depends on it (seed 004, handle_unified_memory_pool, K21).
    # SGLang's name: SGLANG_DISABLE_LAZY_COMPACTION.
    YOCO_DISABLE_LAZY_COMPACTION = EnvBool(ENV_PREFIX + "DISABLE_LAZY_COMPACTION", False)
    # Tokens that leave a request's sliding window between two frees of their sliding-window slots, when
    # out-of-window tokens are freed as decoding proceeds (the hybrid pool without the radix cache;
    # impl/engine/kv_lifecycle.py); the request-cap sizing reserves them (impl/cache/swa_request_cap.py).
    # SGLang's name: SGLANG_SWA_EVICTION_INTERVAL (default 128).
    YOCO_SWA_EVICTION_INTERVAL = EnvInt(ENV_PREFIX + "SWA_EVICTION_INTERVAL", 128, minimum=1)
