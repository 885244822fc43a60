"""KV-cache dtype and pool compatibility rules (seed 004). Filled by the KV-cache issue."""

from __future__ import annotations

from typing import Any, Callable

# Hooks in the seed's order; check_server_args runs them after the attention
# backends are resolved.
KV_CACHE_HOOKS: list[Callable[[Any], None]] = []
