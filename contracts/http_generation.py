"""Issue 35: the engine and parity rules judged through a server's URL (``needs={"http"}``).

The engine contracts (``PARITY-*``, ``ENGINE-*``) need this project's engine in process; these say the same rules
through HTTP, so any server at a URL gets a verdict on them: greedy parity with the flag on and off (batched, one
by one), prompt logprobs with the flag on, seeded sampling, KV freed, prefix-cache hits, greedy against
transformers. Requests go to ``/v1/completions`` with token-id prompts and ``return_token_ids`` (vLLM's extension,
which this project's server also has); prompt logprobs through native ``/generate`` where the server has it, else
``/v1/completions``' ``prompt_logprobs`` (vLLM's extension). Evidence of KV and cache state comes from the server's
own metrics (``sglang:token_usage`` / ``vllm:kv_cache_usage_perc``, cached-token / prefix-hit counters).

A subject with one server (``--subject http://...`` alone) gives the same URL for both launch lines; the parity
checks then compare the server with itself and say so.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from contracts.base import case, contract, inconclusive, note, require, violation
import httpx

from contracts.http_dialect import ServerApi, discover, scrape, stream_body, total
from contracts.http_support import ARGV_OFF, ARGV_ON, TIMEOUT, post, prompt_ids

SOURCE = "issue 35 (every verdict reachable by URL)"
SEED = "seeds/000 PR-B: per-prompt parity"
LOGPROB_TOL = 1e-4  # as contracts.yoco_engine: the flag changes which rows run, not a kept row's arithmetic
TIE_GAP = 1e-3  # as contracts.engine_generation
NEW_TOKENS = 6
# Counters of prompt tokens served from the prefix cache, by metric family.
HIT_COUNTERS = {"sglang": "sglang:cached_tokens_total", "vllm": "vllm:prefix_cache_hits_total"}


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    return [prompt_ids(seed * 100 + i, n) for i, n in enumerate(lengths)]


def _urls(subject) -> dict[bool, str]:
    """{flag on: url}; the same URL twice for a subject with one server."""
    urls = {True: subject.base_url(ARGV_ON), False: subject.base_url(ARGV_OFF)}
    if urls[True] == urls[False]:
        note("one server: flag on and off are the same server (give --subject-fast-prefill)")
    return urls


def _servers(subject) -> list[str]:
    return list(dict.fromkeys(_urls(subject).values()))


def _ids_api(url: str) -> ServerApi:
    api = discover(url)
    if not (api.token_ids or api.native):
        raise inconclusive(f"{url}: /v1/completions returns no output token ids (return_token_ids) and there is no "
                           "/generate: outputs cannot be compared token by token")
    return api


def completions(url: str, prompts: list[list[int]], tokens: int, **extra: Any) -> list[list[int]]:
    """Output token ids of ``prompts`` sent in ONE request (a batch): ``/v1/completions`` with a list of token-id
    prompts and ``return_token_ids``, else native ``/generate``. Greedy unless ``extra`` says otherwise."""
    api = _ids_api(url)
    if api.token_ids:
        body = {"model": api.model, "prompt": prompts, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True, **extra}
        r = post(url, "/v1/completions", body)
        require(r.status_code == 200, f"POST /v1/completions ({len(prompts)} prompts) answered {r.status_code}: "
                                      f"{r.text[:300]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        return [list(c["token_ids"]) for c in choices]
    sp = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True,
          **{("sampling_seed" if k == "seed" else k): v for k, v in extra.items()}}
    r = post(url, "/generate", {"input_ids": prompts, "sampling_params": sp})
    require(r.status_code == 200, f"POST /generate ({len(prompts)} prompts) answered {r.status_code}: {r.text[:300]}")
    return [list(o["output_ids"]) for o in r.json()]


def one_by_one(url: str, prompts: list[list[int]], tokens: int, extras: list[dict[str, Any]] | None = None,
               concurrent: bool = False) -> list[list[int]]:
    """Each prompt in a request of its own: one after another, or all at once (``concurrent``)."""
    extras = extras or [{} for _ in prompts]
    if not concurrent:
        return [completions(url, [p], tokens, **e)[0] for p, e in zip(prompts, extras)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda pe: completions(url, [pe[0]], tokens, **pe[1])[0], zip(prompts, extras)))


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _same(what: str, a: list[list[int]], b: list[list[int]], names: tuple[str, str], prompts, project=False) -> None:
    bad = [f"prompt {i} (len {len(p)}) differs at step {_first_difference(x, y)}: {names[0]} {x}, {names[1]} {y}"
           for i, (p, x, y) in enumerate(zip(prompts, a, b)) if x != y]
    require(not bad, f"{what}: {len(bad)} of {len(prompts)} greedy outputs differ: " + "; ".join(bad), project)


# ---------------------------------------------------------------- greedy parity, flag on vs off


PARITY_LENGTHS = [1, 3, 9, 16, 17, 33, 64, 90]  # 1-token prompts, below / at / past a 16-token window, several


@contract(
    "HTTP-PARITY-BATCHED", f"{SEED}; {SOURCE}", rules=("F15",), needs=("http",),
    rule="Through HTTP, a batch of 8 token-id prompts of mixed lengths (1 to 90 tokens) sent in one /v1/completions "
    f"request gives the same greedy token ids ({NEW_TOKENS} each) from the server launched with "
    "--kv-sharing-fast-prefill as from the one without it.",
)
def parity_batched(subject) -> None:
    urls = _urls(subject)
    ps = _prompts(1, PARITY_LENGTHS)
    on = completions(urls[True], ps, NEW_TOKENS)
    off = completions(urls[False], ps, NEW_TOKENS)
    _same("one batched request, flag on vs off", on, off, ("flag on", "flag off"), ps)
    note(f"compared {len(ps)} prompts x {NEW_TOKENS} greedy token ids, one batched request per server")


def _flush_prefix_cache(url: str) -> bool:
    """Empty the server's prefix cache (SGLang's POST /flush_cache, vLLM's /reset_prefix_cache where served);
    False when it has neither (or refused)."""
    for path in ("/flush_cache", "/reset_prefix_cache"):
        try:
            if httpx.post(url + path, timeout=TIMEOUT).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
    return False


@contract(
    "HTTP-PARITY-ONE-BY-ONE", f"{SEED}; {SOURCE}", rules=("F15",), needs=("http",),
    rule="Through HTTP, each of 8 token-id prompts sent alone (one /v1/completions request after another) gives the same "
    f"greedy token ids ({NEW_TOKENS} each) with --kv-sharing-fast-prefill on as off, and on each server the same "
    "ids as when the prompts are batched in one request.",
    stricter="greedy outputs do not depend on the batch (alone equals batched on each server)",
)
def parity_one_by_one(subject) -> None:
    urls = _urls(subject)
    ps = _prompts(2, PARITY_LENGTHS)
    alone = {flag: one_by_one(url, ps, NEW_TOKENS) for flag, url in urls.items()}
    _same("one by one, flag on vs off", alone[True], alone[False], ("flag on", "flag off"), ps)
    for flag, url in urls.items():
        if flag is False and urls[True] == urls[False]:
            continue  # one server: compared once
        flushed = _flush_prefix_cache(url)  # else the batch would only extend cached prompts by their last token
        batched = completions(url, ps, NEW_TOKENS)
        if not flushed:
            note(f"{url}: no /flush_cache: the batch may have hit prompts the one-by-one requests cached")
        _same(f"flag {'on' if flag else 'off'}, alone vs batched", alone[flag], batched, ("alone", "batched"), ps,
              project=True)
    note(f"compared {len(ps)} prompts x {NEW_TOKENS} greedy token ids, alone on both servers and batched on each")


# ---------------------------------------------------------------- prompt logprobs with the flag on


def prompt_logprobs(url: str, prompt: list[int], top: int = 1) -> list[float]:
    """The logprob of each prompt token after the first (len(prompt) - 1 values): native /generate with
    ``return_logprob`` and ``logprob_start_len=0``, else /v1/completions with ``prompt_logprobs=top`` (vLLM: the
    prompt token's own logprob, beside the ``top`` most likely; 0 asks only the prompt token's)."""
    api = discover(url)
    if api.native:
        sp = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
        r = post(url, "/generate", {"input_ids": prompt, "sampling_params": sp, "return_logprob": True,
                                    "logprob_start_len": 0})
        if r.status_code != 200:
            raise violation(f"POST /generate with return_logprob and logprob_start_len=0 answered {r.status_code}: "
                            f"{r.text[:300]}", project=True)
        rows = r.json()["meta_info"]["input_token_logprobs"]
        require(len(rows) == len(prompt), f"{len(rows)} prompt logprobs for a {len(prompt)}-token prompt")
        require([int(t[1]) for t in rows] == prompt, "the prompt logprobs name other token ids than the prompt's")
        return [float(t[0]) for t in rows[1:]]
    body = {"model": api.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top}
    r = post(url, "/v1/completions", body)
    if r.status_code != 200:
        raise violation(f"POST /v1/completions with prompt_logprobs={top} answered {r.status_code}: {r.text[:300]}",
                        project=True)
    rows = r.json()["choices"][0].get("prompt_logprobs")
    require(isinstance(rows, list) and len(rows) == len(prompt),
            f"/v1/completions returned {type(rows).__name__} prompt_logprobs for a {len(prompt)}-token prompt")
    out = []
    for j, (tok, row) in enumerate(zip(prompt[1:], rows[1:]), start=1):
        entry = (row or {}).get(str(tok))
        if entry is None:
            raise violation(f"prompt logprob {j} does not score the prompt's token {tok}: {row}")
        out.append(float(entry["logprob"]))
    return out


@contract(
    "HTTP-PROMPT-LOGPROBS-FAST-PREFILL", f"{SEED}: rows that feed the LM head include every prompt-logprob row; {SOURCE}", rules=("F13", "F15"), needs=("http",),
    rule="Through HTTP, prompt logprobs (every prompt token's, for 3 prompts of 5, 20 and 37 tokens) are served by the "
    f"server launched with --kv-sharing-fast-prefill, not refused, and equal the flag-off server's within "
    f"{LOGPROB_TOL} (native /generate; else /v1/completions with prompt_logprobs 1 and 0).",
    stricter="prompt logprobs with the flag on are computed (and equal), not refused",
)
def prompt_logprobs_fast_prefill(subject) -> None:
    urls = _urls(subject)
    tops = (1,) if discover(urls[True]).native else (1, 0)
    for top in tops:
        with case(f"prompt_logprobs={top}"):
            for i, p in enumerate(_prompts(3, [5, 20, 37])):
                off = prompt_logprobs(urls[False], p, top)
                on = prompt_logprobs(urls[True], p, top)
                worst = max((abs(a - b), j) for j, (a, b) in enumerate(zip(on, off)))
                require(worst[0] <= LOGPROB_TOL,
                        f"prompt_logprobs={top}, prompt {i} (len {len(p)}): prompt token {worst[1] + 1}'s logprob is "
                        f"{on[worst[1]]:.6f} with the flag on, {off[worst[1]]:.6f} off (differ by {worst[0]:.3g}, more "
                        f"than {LOGPROB_TOL}); max over the prompt")
    note(f"compared every prompt token's logprob (3 prompts), flag on vs off, within {LOGPROB_TOL}")


# ---------------------------------------------------------------- seeded sampling


@contract("HTTP-SEEDED-SAMPLING-REPEATS", f"issue 5 (engine core), item 7; {SOURCE}", rules=("E3",), needs=("http",))
def seeded_sampling_repeats(subject) -> None:
    """Through HTTP, sampling (temperature 1) with a per-request seed repeats exactly: the same 3 seeded requests
    sent again, one after another, and all at once give the same token ids; other seeds give other samples. On
    each server (flag off and on)."""
    ps = _prompts(4, [10, 20, 5])
    seeded = [{"temperature": 1.0, "seed": 100 + i} for i in range(len(ps))]
    others = [{"temperature": 1.0, "seed": 900 + i} for i in range(len(ps))]
    for url in _servers(subject):
        first = one_by_one(url, ps, 12, seeded)
        again = one_by_one(url, ps, 12, seeded)
        together = one_by_one(url, ps, 12, seeded, concurrent=True)
        require(first == again, f"{url}: the same seeds gave different samples on a second run: {first} vs {again}")
        require(first == together, f"{url}: seeded samples depend on the batch: one after another {first}, all at "
                                   f"once {together}")
        other = one_by_one(url, ps, 12, others)
        require(other != first, f"{url}: different seeds gave identical samples for every prompt: the seed is not used")
    note("3 seeded requests x 12 sampled tokens: repeated, concurrent, and other seeds, on each server")


# ---------------------------------------------------------------- KV freed


def _kv_usage(api: ServerApi) -> tuple[float, int]:
    """(KV usage 0..1, running + waiting requests) from the server's /metrics."""
    m = scrape(api.url)
    names = api.metrics
    assert names is not None, "the contract refuses a server without metrics before it reads them"
    busy = (total(m, names.running) or 0) + (total(m, names.waiting) or 0)
    return total(m, names.kv_usage) or 0.0, int(busy)


def _usage_while_running(api: ServerApi, prompt: list[int], tokens: int) -> float:
    """The highest KV usage the metrics show while one long streamed request runs."""
    path, body = stream_body(api, prompt, tokens)
    seen = 0.0
    with httpx.stream("POST", api.url + path, json=body, timeout=TIMEOUT) as r:
        require(r.status_code == 200, f"streaming {path} answered {r.status_code}")
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data:")
            if line.startswith("data:") and events % 4 == 1:  # every 4th event: scraping takes time too
                seen = max(seen, _kv_usage(api)[0])
    return seen


def _settled(api: ServerApi, seconds: float = 5.0) -> tuple[float, int]:
    deadline = time.monotonic() + seconds
    usage, busy = _kv_usage(api)
    while (usage or busy) and time.monotonic() < deadline:
        time.sleep(0.1)
        usage, busy = _kv_usage(api)
    return usage, busy


@contract("HTTP-KV-FREED", f"issue 5 (engine core), item 7; {SOURCE}", rules=("E4",), needs=("http",))
def kv_freed(subject) -> None:
    """Through HTTP, once every request has finished (a batch of 4 in one request, 3 sent at once, one long streamed
    request) the server's KV-usage metric (sglang:token_usage, vllm:kv_cache_usage_perc) is back to 0 within
    seconds (slots held only by the evictable prefix cache count as free), after showing KV in use while a request
    ran. On each server."""
    for url in _servers(subject):
        api = _ids_api(url)
        if api.metrics is None:
            raise violation(f"{url}/metrics exports no KV-usage gauge in a known family's names (sglang:*, vllm:*): "
                            "whether finished requests free their KV cannot be seen", project=True)
        ps = _prompts(5, [30, 12, 45, 7])
        completions(url, ps, 8)
        one_by_one(url, ps[:3], 8, concurrent=True)
        during = _usage_while_running(api, prompt_ids(555, 40), 48)
        require(during > 0, f"{url}: {api.metrics.kv_usage} stayed 0 while a 40-token prompt decoded 48 tokens: the "
                            "metric does not show KV in use, so its return to 0 proves nothing")
        usage, busy = _settled(api)
        require(busy == 0, f"{url}: {busy} request(s) still running or waiting 5 s after every request finished")
        require(usage == 0.0, f"{url}: {api.metrics.kv_usage}={usage} 5 s after every request finished (it was "
                              f"{during:.4g} while one ran): finished requests hold KV")
    note("KV usage > 0 while a request ran, 0 within 5 s after all finished (batch, concurrent, streamed)")


# ---------------------------------------------------------------- prefix-cache hits


def _hits(api: ServerApi) -> float | None:
    name = HIT_COUNTERS.get(api.family)
    return total(scrape(api.url), name) if name else None


def _prefix_caching_off(api: ServerApi) -> bool:
    """The server says it runs without a prefix cache (vLLM's cache_config_info, /get_server_info)."""
    if isinstance(api.server_info, dict) and api.server_info.get("disable_radix_cache") is True:
        return True
    if api.metrics is not None and api.metrics.config_info is not None:
        metric = api.metrics.config_info[0]
        labels = [ls for n, ls, _ in scrape(api.url) if n == metric]
        return any(ls.get("enable_prefix_caching") == "False" for ls in labels)
    return False


PREFIX_LEN, PREFIX_SHARED = 160, 136


@contract("HTTP-PREFIX-HIT-INVARIANT", f"issue 5 (engine core), item 7; {SOURCE}", rules=("E2",), needs=("http",))
def prefix_hit_invariant(subject) -> None:
    """Through HTTP, a 160-token prompt sent again (a full prefix-cache hit) and then a prompt sharing its first 136
    tokens (a partial hit) move the server's cached-token / prefix-hit counter and get the greedy token ids the
    same prompts get cold: the repeat equals the first answer; with two servers each prompt's hit answer on one
    equals its cold answer on the other (each server gets the pair in the other order)."""
    # long enough for whole cache blocks of 64 tokens (vLLM-CPU's smallest for Gemma-4's hybrid KV cache: blocks of
    # 32, grouped by the least common multiple of its layer groups' block sizes): a 48-token prompt never hit there
    x = prompt_ids(6000, PREFIX_LEN)
    y = x[:PREFIX_SHARED] + prompt_ids(6001, PREFIX_LEN - PREFIX_SHARED + 1)
    answers: list[dict[tuple[int, ...], list[int]]] = []
    for url, (first, second) in zip(_servers(subject), ((x, y), (y, x))):
        api = _ids_api(url)
        before = _hits(api)
        if before is None:
            raise violation(f"{url}/metrics exports no prefix-cache hit counter ({', '.join(HIT_COUNTERS.values())}): "
                            "a hit cannot be seen", project=True)
        cold = completions(url, [first], NEW_TOKENS)[0]
        again = completions(url, [first], NEW_TOKENS)[0]
        partial = completions(url, [second], NEW_TOKENS)[0]
        moved = (_hits(api) or 0.0) - before
        if moved <= 0:
            if _prefix_caching_off(api):
                raise inconclusive(f"{url} runs with its prefix cache off (as launched): a repeated prompt and one "
                                   f"sharing {PREFIX_SHARED} tokens did not hit it ({HIT_COUNTERS[api.family]} moved {moved:g}); "
                                   f"the repeat's ids equal the first's: {again == cold}")
            raise violation(f"{url}: a repeated {PREFIX_LEN}-token prompt and one sharing {PREFIX_SHARED} tokens moved "
                            f"{HIT_COUNTERS[api.family]} by {moved:g}: no prefix-cache hit")
        require(again == cold, f"{url}: a repeated prompt's greedy ids changed on a prefix-cache hit: cold {cold}, "
                               f"hit {again}")
        answers.append({tuple(first): cold, tuple(second): partial})
    if len(answers) == 2:
        # server 0 got x cold and y with a partial hit; server 1 the other way round
        for p, hit_on, what in ((y, 0, f"the prompt sharing {PREFIX_SHARED} tokens"), (x, 1, f"the {PREFIX_LEN}-token prompt")):
            hit, cold = answers[hit_on][tuple(p)], answers[1 - hit_on][tuple(p)]
            require(hit == cold, f"{what}: greedy ids with a partial prefix-cache hit {hit}, cold on the other server "
                                 f"{cold}")
    else:
        note("one server: the partial hit's answer has no cold answer to compare with")
    note("full and partial prefix-cache hits (the counter moved); greedy ids as cold")


# ---------------------------------------------------------------- the back half's edge batches (F14)

EDGE_BUDGET = 64  # tokens per prefill step in the launch lines below: the 300- and 450-token prompts take 5 and 8 chunks
EDGE_ARGV_OFF = [*ARGV_OFF, "--chunked-prefill-size", str(EDGE_BUDGET)]
EDGE_ARGV_ON = [*EDGE_ARGV_OFF, "--kv-sharing-fast-prefill"]


def _while_decoding(api: ServerApi, runner: list[int], late: list[list[int]], tokens: int) -> tuple[list[list[int]], bool]:
    """Greedy ids of ``late``, each sent in a request of its own once ``runner`` (streamed, 64 new tokens) has
    streamed two tokens, so they arrive while it decodes; and whether its stream was still open when all of them
    had answered (prefill of the late prompts beside a running decode)."""

    path, body = stream_body(api, runner, 64)
    started, done = threading.Event(), threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", api.url + path, json=body, timeout=TIMEOUT) as r:
                events = 0
                for line in r.iter_lines():
                    events += line.startswith("data:")
                    if events >= 2:
                        started.set()
        finally:
            started.set()
            done.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    started.wait(TIMEOUT.read or 120)
    out = one_by_one(api.url, late, tokens, concurrent=True)
    overlapped = not done.is_set()
    t.join(TIMEOUT.read or 120)
    return out, overlapped


@contract(
    "HTTP-PARITY-EDGE-BATCHES", f"{SEED}; {SOURCE}", rules=("F14", "F15"), needs=("http",),
    rule="Through HTTP, on the batches where fast prefill's back half attends to more keys than the rows it computes "
    "(the selected rows as queries over each request's full context) the greedy token ids with "
    "--kv-sharing-fast-prefill equal those without it: prompts longer than the server's per-step token budget "
    f"({EDGE_BUDGET} in this project's launch; later chunks over a cached prefix), prefix-cache hits (a repeated "
    f"{PREFIX_LEN}-token prompt and one sharing its first {PREFIX_SHARED}), and prompts arriving while another "
    "request decodes.",
)
def parity_edge_batches_http(subject) -> None:
    """The twin of PARITY-EDGE-BATCHES by URL: the server pair's own launch decides its chunk budget and prefix
    cache (vLLM: ``--max-num-batched-tokens 64`` and prefix caching on), so the evidence notes what each server
    showed: its prefix-hit counter's move and, where it says, its chunk budget."""
    urls = {True: subject.base_url(EDGE_ARGV_ON), False: subject.base_url(EDGE_ARGV_OFF)}
    if urls[True] == urls[False]:
        note("one server: flag on and off are the same server (give --subject-fast-prefill)")
    long = _prompts(70, [300, 450, 5, 37])
    x = prompt_ids(7000, PREFIX_LEN)
    y = x[:PREFIX_SHARED] + prompt_ids(7001, PREFIX_LEN - PREFIX_SHARED + 1)
    late = _prompts(71, [20, 90, 200])
    got: dict[bool, dict[str, list[list[int]]]] = {}
    evidence = []
    for flag, url in urls.items():
        api = _ids_api(url)
        _flush_prefix_cache(url)
        before = _hits(api)
        chunked = completions(url, long, NEW_TOKENS)  # one request: the long prompts' chunks share steps
        hits = [completions(url, [p], NEW_TOKENS)[0] for p in (x, x, y)]  # cold, full hit, partial hit
        moved = None if before is None else (_hits(api) or 0.0) - before
        mixed, overlapped = _while_decoding(api, prompt_ids(7002, 40), late, NEW_TOKENS)
        got[flag] = {"long prompts in one request": chunked, "prefix-cache hits": hits, "prompts beside a decode": mixed}
        info = api.server_info if isinstance(api.server_info, dict) else {}
        budget = info.get("chunked_prefill_size", "not exported")
        evidence.append(f"flag {'on' if flag else 'off'} ({url}): chunk budget {budget}, prefix-hit counter "
                        f"{'absent' if moved is None else f'moved {moved:g}'}, late prompts "
                        f"{'beside the running decode' if overlapped else 'after the decode had finished'}")
    for what, ps in (("long prompts in one request", long), ("prefix-cache hits", [x, x, y]),
                     ("prompts beside a decode", late)):
        _same(f"{what}, flag on vs off", got[True][what], got[False][what], ("flag on", "flag off"), ps)
    note("; ".join(evidence))


# ---------------------------------------------------------------- greedy against transformers


@contract(
    "HTTP-GREEDY-MATCHES-TRANSFORMERS", f"issue 5 (engine core), item 7; issue 4 (Gemma-4 in PyTorch), item 6; {SOURCE}", rules=("E1", "M1"), needs=("http",),
    rule=f"Through HTTP, greedy token ids ({NEW_TOKENS} each) of 4 token-id prompts of mixed lengths batched in one "
    "/v1/completions request equal transformers' greedy decoding (float32) of the served checkpoint folder, token "
    f"for token up to the first near tie (top-2 gap < {TIE_GAP}). On each server (flag off and on).",
)
def greedy_matches_transformers(subject) -> None:
    from contracts.engine_generation import reference_greedy

    ps = _prompts(7, [3, 17, 40, 9])
    for url in _servers(subject):
        api = _ids_api(url)
        if api.hf_config() is None:
            raise inconclusive(f"{url} names no checkpoint folder on this machine (GET /v1/models root: "
                               f"{api.model_root!r}): no transformers reference can be built")
        outs = completions(url, ps, NEW_TOKENS)
        bad = []
        for i, (p, o) in enumerate(zip(ps, outs)):
            ref, gaps = reference_greedy(api.model_root, tuple(p), NEW_TOKENS)
            step = _first_difference(o, list(ref))
            if step is not None and not (step < len(gaps) and gaps[step] < TIE_GAP):
                gap = f"top-2 gap {gaps[step]:.4f}" if step < len(gaps) else "length differs"
                bad.append(f"prompt {i} (len {len(p)}) step {step}: server {o}, transformers {list(ref)} ({gap})")
        require(not bad, f"{url}: {len(bad)} of {len(ps)} greedy outputs differ from transformers': " + "; ".join(bad))
    note(f"4 prompts x {NEW_TOKENS} greedy ids against transformers float32 on the served folder, on each server")
