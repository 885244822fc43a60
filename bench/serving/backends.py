"""The serving benchmark's backends: SGLang ``bench_serving``'s names for the streaming request functions
of ``contracts.sse_client`` (where the clients live, so an installed ``contracts`` can time servers too).

``sglang`` / ``sglang-native``: native ``/generate`` with ``input_ids``; ``sglang-oai``: ``/v1/completions``
with token ids as the prompt; ``sglang-oai-chat``: ``/v1/chat/completions`` (the prompt ids decoded to text first).
"""

from __future__ import annotations

from contracts.sse_client import (
    RequestFunc,
    RequestFuncInput,
    RequestFuncOutput,
    openai_chat,
    openai_completions,
    sglang_generate,
)

__all__ = ["BACKENDS", "RequestFunc", "RequestFuncInput", "RequestFuncOutput"]

BACKENDS: dict[str, RequestFunc] = {
    "sglang": sglang_generate,
    "sglang-native": sglang_generate,
    "sglang-oai": openai_completions,
    "sglang-oai-chat": openai_chat,
}
