"""How the hybrid pool's sliding-window budget is sized: by ``--swa-full-tokens-ratio``, or by the requests it
must hold (SGLang's ``SWARequestCapPoolConfigurator`` and ``compute_swa_request_cap``, this engine's code).

Request cap (``SWARequestCap``): chosen, as in SGLang, when ``--max-running-requests`` is given, the radix
cache is off (``--disable-radix-cache``) and chunked prefill is on. No cached prefix keeps sliding-window
KV then, and every request frees the tokens that left its window as it goes
(``HybridSWAPool.maybe_evict_swa`` in ``impl/engine/kv_pools.py``: each prefill chunk, and every ``eviction_interval`` tokens of decoding), so
a request never holds more than

    per_request = window + eviction_interval x draft_tokens + page + decode_alloc

sliding-window slots (its window, the tokens that left it since the last free, the page that aligns the free,
one step's allocation: 1, or a verify's rows with speculative decoding), and at most one prefill chunk is in
flight (no overlap scheduler). The sliding-window pool gets exactly

    tokens = per_request x max_running_requests + chunks_in_flight x chunked_prefill_size + page

and the rest of the KV budget goes to the full-attention pool (``request_cap_budget``); the ratio is not
used. Admission (``HybridSWAPool.admits``) keeps the worst cases of the admitted requests within the
sliding-window pool, so it is never over-committed: a decode step always finds its slots. (A prefill chunk takes
what is free, and its tokens below the window are freed before the next step; the cap's chunk term lets it take
a whole chunk while every admitted request is at its worst case.) Otherwise the ratio sizes it
(``swa_pool.hybrid_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from impl.envs import envs
from impl.cache.swa_pool import HybridBudget

PAGE_SIZE = 1  # this engine's KV pages are one token
CHUNKS_IN_FLIGHT = 1  # no overlap scheduler: one prefill chunk per forward, the forward done before the next


@dataclass(frozen=True)
class SWARequestCap:
    window: int  # the model's sliding window
    eviction_interval: int  # YOCO_SWA_EVICTION_INTERVAL (SGLang's SGLANG_SWA_EVICTION_INTERVAL)
    draft_tokens: int  # tokens one verify commits at most (--speculative-num-draft-tokens; 1 without speculation)
    decode_alloc: int  # slots one decode step allocates per request (a verify: max(num_steps, draft tokens))
    max_running_requests: int
    chunked_prefill_size: int
    chunks_in_flight: int = CHUNKS_IN_FLIGHT
    page_size: int = PAGE_SIZE

    def __post_init__(self) -> None:
        if self.chunked_prefill_size <= 0 or self.max_running_requests < 1 or self.eviction_interval < 1:
            raise ValueError(f"a request cap needs chunked prefill, at least one request and an eviction interval "
                             f">= 1: {self}")

    @property
    def per_request(self) -> int:
        """Sliding-window slots one request holds at most (SGLang's per_request)."""
        return self.window + self.eviction_interval * self.draft_tokens + self.page_size + self.decode_alloc

    @property
    def chunk_tokens(self) -> int:
        """What the prefill chunks in flight add to the requests' holdings, and the page that aligns them."""
        return self.chunks_in_flight * self.chunked_prefill_size + self.page_size

    @property
    def tokens(self) -> int:
        """The sliding-window pool of the request cap."""
        return self.per_request * self.max_running_requests + self.chunk_tokens

    def worst_case(self, total_tokens: int) -> int:
        """Sliding-window slots a request of ``total_tokens`` (prompt + max new tokens) holds at most."""
        return min(total_tokens, self.per_request)

    def formula(self) -> str:
        spec = f" x {self.draft_tokens} draft tokens" if self.draft_tokens != 1 else ""
        return (f"{self.max_running_requests} requests x (window {self.window} + eviction interval "
                f"{self.eviction_interval}{spec} + page {self.page_size} + decode {self.decode_alloc}) + "
                f"{self.chunks_in_flight} chunk x {self.chunked_prefill_size} + page {self.page_size} = {self.tokens} "
                "tokens")

    def as_dict(self) -> dict:
        return {"window": self.window, "eviction_interval": self.eviction_interval, "draft_tokens": self.draft_tokens,
                "decode_alloc": self.decode_alloc, "max_running_requests": self.max_running_requests,
                "chunked_prefill_size": self.chunked_prefill_size, "chunks_in_flight": self.chunks_in_flight,
                "page_size": self.page_size, "per_request": self.per_request, "tokens": self.tokens}


@dataclass(frozen=True)
class SWASizing:
    """Which rule sizes the sliding-window pool, and why (the startup log and ``/get_server_info``)."""

    mode: str  # "request_cap" | "ratio"
    reason: str
    eviction_interval: int
    ratio: float  # --swa-full-tokens-ratio (not used by the request cap)
    cap: SWARequestCap | None = None

    def describe(self) -> str:
        if self.cap is not None:
            return (f"KV pool sizing: request cap (SGLang's SWARequestCapPoolConfigurator; --swa-full-tokens-ratio not "
                    f"used), because {self.reason}: the sliding-window pool holds {self.cap.formula()}; the "
                    "full-attention pool gets the rest of the KV budget")
        return (f"KV pool sizing: --swa-full-tokens-ratio {self.ratio:g} sizes the sliding-window pool, because "
                f"{self.reason} (SGLang's request cap needs --max-running-requests, --disable-radix-cache and chunked "
                "prefill)")

    def as_dict(self) -> dict:
        return {"mode": self.mode, "reason": self.reason, "eviction_interval": self.eviction_interval,
                "ratio": self.ratio, "request_cap": None if self.cap is None else self.cap.as_dict()}


def swa_eviction_interval() -> int:
    return envs.YOCO_SWA_EVICTION_INTERVAL.get()


def spec_decode_alloc(num_steps: int | None, num_draft_tokens: int | None) -> int:
    """Slots one verify allocates per request (SGLang's spec_decode_alloc_len_per_request, page 1, top-k 1)."""
    return max(num_steps or 1, num_draft_tokens or 1)


def choose_swa_sizing(server_args, sliding_window: int, chunked_prefill_size: int) -> SWASizing:
    """SGLang's ``SWARequestCapPoolConfigurator.is_applicable``: the request cap when --max-running-requests is
    given, the radix cache is off and chunked prefill is on (the model has both layer types: the hybrid pool
    applies); the ratio otherwise. ``server_args``: resolved."""
    interval = swa_eviction_interval()
    max_running = server_args.max_running_requests
    missing = []
    if max_running is None:
        missing.append("--max-running-requests is not given")
    if not server_args.disable_radix_cache:
        missing.append("the radix cache is on")
    if chunked_prefill_size <= 0:
        missing.append("chunked prefill is off")
    ratio = float(server_args.swa_full_tokens_ratio)
    if missing:
        return SWASizing("ratio", "; ".join(missing), interval, ratio)
    spec = getattr(server_args, "speculative_algorithm", None) is not None
    draft = (server_args.speculative_num_draft_tokens or 1) if spec else 1
    alloc = spec_decode_alloc(server_args.speculative_num_steps, server_args.speculative_num_draft_tokens) if spec else 1
    cap = SWARequestCap(int(sliding_window), interval, draft, alloc, int(max_running), int(chunked_prefill_size))
    reason = (f"--max-running-requests {max_running} is given with the radix cache off and chunked prefill "
              f"({chunked_prefill_size} tokens)")
    return SWASizing("request_cap", reason, interval, ratio, cap)


def request_cap_budget(one_pool_tokens: int, full_bytes: int, swa_bytes: int, cap: SWARequestCap,
                       full_tokens: int | None = None, budget_reason: str = "") -> HybridBudget:
    """The two budgets of the request cap: the sliding-window pool holds ``cap.tokens``; the full-attention pool
    the rest of the bytes of ``one_pool_tokens`` one-pool tokens (SGLang's ``calculate_pool_sizes``). With
    ``full_tokens`` (``--max-total-tokens``, the full-attention budget) that many full-attention tokens and
    ``min(cap, full_tokens)`` sliding-window ones (``calculate_pool_sizes_from_max_tokens``). ValueError when the
    cap leaves no room for the full-attention pool."""
    swa = cap.tokens
    if full_tokens is not None:
        full = max(int(full_tokens), 1)
        swa = min(swa, full)
        if swa < cap.per_request:
            raise ValueError(
                f"--max-total-tokens {full} leaves the sliding-window pool of the request cap {swa} tokens (at most "
                f"--max-total-tokens), fewer than one request's worst case ({cap.per_request}): a long request could "
                f"never be admitted. Raise --max-total-tokens to at least {cap.per_request}.")
        return HybridBudget(full, swa, (full * full_bytes + swa * swa_bytes) // (full_bytes + swa_bytes))
    available = one_pool_tokens * (full_bytes + swa_bytes)
    full = (available - swa * swa_bytes) // full_bytes
    if full <= 0:
        gib = 2**30
        raise ValueError(
            f"the sliding-window pool's request cap ({cap.formula()}, {swa * swa_bytes / gib:.2f} GiB) leaves no room "
            f"for the full-attention KV pool within the KV budget of {available / gib:.2f} GiB"
            + (f" ({budget_reason})" if budget_reason else "")
            + ". Reduce --max-running-requests or --chunked-prefill-size, lower YOCO_SWA_EVICTION_INTERVAL, or raise "
            "the KV budget (--mem-fraction-static; --max-total-tokens names the full-attention pool itself).")
    return HybridBudget(int(full), swa, one_pool_tokens)
