"""The ``http`` subject: any running server at a base URL (``pytest spec --subject http://127.0.0.1:30000``).

It cannot launch servers, so ``base_url`` ignores ``argv``: every contract talks
to the one server. Contracts that compare launches (fast prefill on vs off)
notice that both URLs are the same and check what one server can show.

Given a second server launched with ``--kv-sharing-fast-prefill``
(``--subject-fast-prefill http://...``), launch lines with that flag go to it and the
subject gains the ``bench`` capability: the THRU contracts time the two servers
through the streaming ``/generate`` route (wall clock, SGLang bench_serving's TTFT).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import httpx

from contracts.subject import GenRequest, TimedOutput

FLAG = "--kv-sharing-fast-prefill"


class HttpSubject:
    def __init__(self, url: str, fast_prefill_url: str | None = None):
        self.url = url.rstrip("/")
        self.fast_prefill_url = fast_prefill_url.rstrip("/") if fast_prefill_url else None
        self.name = f"http({self.url})" + (f"+fast-prefill({self.fast_prefill_url})" if self.fast_prefill_url else "")
        self.capabilities = frozenset({"http", "bench"} if self.fast_prefill_url else {"http"})

    def base_url(self, argv: Sequence[str]) -> str:
        return self.fast_prefill_url if (self.fast_prefill_url and FLAG in argv) else self.url

    # ---- bench ---------------------------------------------------------------------
    def model_config(self, argv: Sequence[str]) -> dict[str, Any]:
        """The ``model_config`` object of GET /get_model_info (empty when the server does not report one)."""
        r = httpx.get(self.base_url(argv) + "/get_model_info", timeout=60)
        r.raise_for_status()
        info = r.json()
        return dict(info.get("model_config") or {})

    def timed_generate(self, argv: Sequence[str], requests: Sequence[GenRequest]) -> list[TimedOutput]:
        return asyncio.run(_timed(self.base_url(argv), requests))


async def _timed(url: str, requests: Sequence[GenRequest]) -> list[TimedOutput]:
    from bench.serving.backends import RequestFuncInput, sglang_generate

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        outs = await asyncio.gather(*(
            sglang_generate(client, RequestFuncInput(url, "", list(r.input_ids), len(r.input_ids), r.max_new_tokens,
                                                     ignore_eos=r.ignore_eos))
            for r in requests
        ))
    bad = [o for o in outs if not o.success]
    if bad:
        raise RuntimeError(f"POST {url}/generate failed: {bad[0].error}")
    return [TimedOutput(o.ttft, o.latency, o.output_len, "wall") for o in outs]
