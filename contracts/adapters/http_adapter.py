"""The ``http`` subject: any running server at a base URL (``pytest spec --subject http://127.0.0.1:30000``).

It cannot launch servers, so ``base_url`` ignores ``argv``: every contract talks to the one server. Contracts
that compare launches (fast prefill on vs off) notice that both URLs are the same and check what one server can
show. What the server offers (native ``/generate`` or only the OpenAI routes, ``/get_server_info``,
``/get_model_info``, output token ids, its metric names) is discovered on first use
(``contracts.http_dialect.discover``), and the HTTP contracts use the routes it has.

Given a second server launched with ``--kv-sharing-fast-prefill`` (``--subject-fast-prefill http://...``),
launch lines with that flag go to it and the subject gains the ``bench`` capability: the THRU contracts time the
two servers through streaming requests (native ``/generate``, else ``/v1/completions`` with token-id prompts;
wall clock, SGLang bench_serving's TTFT). The FLOP bound they need comes from ``/get_model_info``'s
``model_config``, else from the served folder's ``config.json`` when the server names one that exists here.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import httpx

from contracts.base import Inconclusive
from contracts.flops import config_from_hf
from contracts.http_dialect import ServerApi, discover
from contracts.sse_client import RequestFuncInput, openai_completions, sglang_generate
from contracts.subject import GenRequest, TimedOutput

FLAG = "--kv-sharing-fast-prefill"
# httpx's errors of a server that closed or refused the connection (contracts.sse_client records "Name: message")
TRANSPORT_ERRORS = frozenset({"ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "LocalProtocolError",
                              "CloseError", "NetworkError", "TransportError"})


class HttpSubject:
    def __init__(self, url: str, fast_prefill_url: str | None = None, restart_wait: float = 0.0):
        self.url = url.rstrip("/")
        self.fast_prefill_url = fast_prefill_url.rstrip("/") if fast_prefill_url else None
        # how long a dead server may take to come back: the launcher restarts it (--subject-restart-wait;
        # contracts.liveness)
        self.restart_wait = restart_wait
        self.name = f"http({self.url})" + (f"+fast-prefill({self.fast_prefill_url})" if self.fast_prefill_url else "")
        self.capabilities = frozenset({"http", "bench"} if self.fast_prefill_url else {"http"})

    def base_url(self, argv: Sequence[str]) -> str:
        return self.fast_prefill_url if (self.fast_prefill_url and FLAG in argv) else self.url

    def watched_servers(self) -> list[str]:
        """The servers whose death under a contract fails that contract (``contracts.liveness``)."""
        return [self.url] + ([self.fast_prefill_url] if self.fast_prefill_url else [])

    def api(self, argv: Sequence[str] = ()) -> ServerApi:
        return discover(self.base_url(argv))

    def describe(self) -> str:
        api = self.api()
        engine = {"sglang": "an SGLang-dialect server", "vllm": "vLLM"}.get(api.family, "an OpenAI-compatible server")
        version = f" {api.version}" if api.version else ""
        routes = "native /generate" if api.native else "OpenAI routes only"
        second = f", flag on at {self.fast_prefill_url}" if self.fast_prefill_url else ""
        return f"{engine}{version} at {self.url}{second} (model {api.model}; {routes})"

    # ---- bench ---------------------------------------------------------------------
    def model_config(self, argv: Sequence[str]) -> dict[str, Any]:
        """The served model's config fields for the FLOP bound: ``/get_model_info``'s ``model_config``, else derived
        from the served folder's config.json (when it is on this machine)."""
        api = self.api(argv)
        cfg = dict((api.model_info or {}).get("model_config") or {})
        if cfg:
            return cfg
        hf = api.hf_config()
        if hf is None:
            raise Inconclusive(f"{api.url} reports no model config (no /get_model_info, no local model folder): "
                                "the prefill FLOP bound cannot be computed")
        return config_from_hf(hf)

    def timed_generate(self, argv: Sequence[str], requests: Sequence[GenRequest]) -> list[TimedOutput]:
        return asyncio.run(_timed(self.api(argv), requests))


async def _timed(api: ServerApi, requests: Sequence[GenRequest]) -> list[TimedOutput]:
    send = sglang_generate if api.native else openai_completions
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0)) as client:
        outs = await asyncio.gather(*(
            send(client, RequestFuncInput(api.url, api.model, list(r.input_ids), len(r.input_ids), r.max_new_tokens,
                                          ignore_eos=r.ignore_eos))
            for r in requests
        ))
    bad = [o for o in outs if not o.success]
    gone = [o for o in bad if o.error.split(":", 1)[0] in TRANSPORT_ERRORS]
    if gone:  # the server stopped answering: a crash (contracts.base), not a harness error
        raise httpx.TransportError(f"{'POST /generate' if api.native else 'POST /v1/completions'} at {api.url}: "
                                   f"{len(gone)} of {len(outs)} requests lost the connection: {gone[0].error}")
    if bad:
        raise RuntimeError(f"{'POST /generate' if api.native else 'POST /v1/completions'} at {api.url} failed: {bad[0].error}")
    return [TimedOutput(o.ttft, o.latency, o.output_len, "wall") for o in outs]
