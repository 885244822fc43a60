"""Subject adapters. Only modules here may import an implementation."""

from __future__ import annotations

from typing import Any


def make_subject(name: str, fast_prefill_url: str | None = None, restart_wait: float = 0.0) -> Any:
    if name == "impl":
        if fast_prefill_url:
            raise ValueError("--subject-fast-prefill pairs with an http:// --subject; the impl subject launches its own servers")
        from contracts.adapters.impl_adapter import ImplSubject

        return ImplSubject()
    if name == "sglang":
        if fast_prefill_url:
            raise ValueError("--subject-fast-prefill pairs with an http:// --subject; the sglang subject has no server")
        from contracts.adapters.sglang_adapter import SglangSubject

        return SglangSubject()
    if name == "vllm":
        if fast_prefill_url:
            raise ValueError("--subject-fast-prefill pairs with an http:// --subject; the vllm subject has no server")
        from contracts.adapters.vllm_adapter import VllmSubject

        return VllmSubject()
    if name.startswith("http://") or name.startswith("https://"):
        from contracts.adapters.http_adapter import HttpSubject

        return HttpSubject(name, fast_prefill_url, restart_wait)
    raise ValueError(f"unknown --subject {name!r}; use 'impl', 'sglang' (SGLang's argument code in its virtualenv), 'vllm' (vLLM's, in its own) or the base URL of a running server (http://host:port)")
