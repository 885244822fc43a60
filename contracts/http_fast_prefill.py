"""Issue 8 (HTTP server): ``--kv-sharing-fast-prefill`` seen through HTTP (``needs={"http"}``).

With the flag on the prefill runs the triton backend (on CPU its compiled CPU
kernels, or the torch reference where no compiler exists), so the parity check
uses a few short prompts and few tokens. Both launches decode with torch_native.

A subject that cannot launch (``--subject http://...``) returns the same URL
for both launch lines; the checks then verify what one server can show
(a consistent report, deterministic greedy output).
"""

from __future__ import annotations

from typing import Any

from contracts.base import contract, note, require, violation
from contracts.http_dialect import discover, scrape, total
from contracts.http_support import ARGV_OFF, ARGV_ON, get_json, openai_client, post, prompt_ids

SOURCE = "seeds/000 PR-B; issue 8 (HTTP server)"
FIELD = "kv_sharing_fast_prefill"


def _prefill_backend(info: dict[str, Any]) -> Any:
    return info.get("prefill_attention_backend") or info.get("attention_backend")


def _config_info_flag(url: str) -> bool | None:
    """The resolved flag from the server's config-info gauge (vLLM's vllm:cache_config_info), None without one."""
    names = discover(url).metrics
    if names is None or names.config_info is None:
        return None
    metric, label = names.config_info
    values = {ls[label] for n, ls, _ in scrape(url) if n == metric and label in ls}
    require(len(values) == 1 and values <= {"True", "False"},
            f"{url}/metrics: {metric} must carry one {label} label, True or False; got {sorted(values) or 'none'}")
    return values == {"True"}


def _flag_from_metrics(urls: dict[bool, str]) -> None:
    """H7 on a server without /get_server_info: the resolved flag as its config-info gauge reports it."""
    flags = {}
    for launched, url in urls.items():
        flag = _config_info_flag(url)
        if flag is None:
            raise violation(f"{url} reports no resolved arguments (no /get_server_info or /server_info, no "
                            "/get_model_info, no config-info metric): the flag's resolution cannot be read", project=True)
        flags[launched] = flag
    names = discover(urls[True]).metrics
    metric = names.config_info[0] if names is not None and names.config_info is not None else "a config-info metric"
    note(f"no /get_server_info: the resolved flag read from {metric}; the server lists no resolutions with their "
         "source, and its prefill attention backend is its own (the triton requirement is SGLang's)")
    if urls[True] != urls[False]:
        require(flags[True] is True and flags[False] is False,
                f"{metric}: launched with the flag the server reports {FIELD}={flags[True]}; without it "
                f"{flags[False]}; expected True and False")
    else:
        note("one server: its report is checked for consistency only (give --subject-fast-prefill)")


@contract("HTTP-SERVER-INFO-FLAG", SOURCE, rules=("H7",), needs=("http",))
def server_info_flag(subject) -> None:
    """GET /get_server_info reports the resolved kv_sharing_fast_prefill flag (true only when launched with
    --kv-sharing-fast-prefill, and then with the triton prefill backend) and the declared resolutions with their
    source; /get_model_info agrees. A server without those routes that exports its resolved cache config as a
    metric (vLLM's vllm:cache_config_info) is held to the flag there: true only on the server launched with it."""
    urls = {launched: subject.base_url(argv) for launched, argv in ((True, ARGV_ON), (False, ARGV_OFF))}
    if any(discover(u).server_info is None or discover(u).model_info is None for u in urls.values()):
        _flag_from_metrics(urls)
        return
    for url in urls.values():
        info = get_json(url, "/get_server_info")
        require(isinstance(info.get(FIELD), bool), f"/get_server_info must report {FIELD} as a bool, got "
                                                        f"{info.get(FIELD)!r}")
        res = info.get("resolutions")
        require(isinstance(res, list) and all(isinstance(r, str) and " by " in r for r in res),
                f"/get_server_info must list the declared resolutions, each naming its source ('... by <rule>'), got {res!r}")
        if info[FIELD]:
            require(_prefill_backend(info) == "triton",
                    f"fast prefill on, but the reported prefill backend is {_prefill_backend(info)!r}, not triton")
        model_flag = get_json(url, "/get_model_info").get(FIELD)
        require(model_flag == info[FIELD], f"/get_model_info says {FIELD}={model_flag!r}, /get_server_info "
                                                f"says {info[FIELD]!r}")
    if urls[True] != urls[False]:
        on, off = (get_json(urls[k], "/get_server_info")[FIELD] for k in (True, False))
        require(on is True and off is False, f"launched with the flag the server reports {FIELD}={on}; without "
                                                  f"it {off}; expected True and False")


def _outputs(url: str, prompts: list[list[int]], tokens: int) -> tuple[list[Any], str]:
    """A batch of token-id prompts (native /generate, else one /v1/completions request with a list of prompts) and
    a chat completion: greedy outputs as token ids (as text where the server returns no ids)."""
    api = discover(url)
    if api.native:
        sp = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}
        r = post(url, "/generate", {"input_ids": prompts, "sampling_params": sp})
        require(r.status_code == 200, f"POST /generate (a batch) answered {r.status_code}: {r.text[:300]}")
        batch = [o["output_ids"] for o in r.json()]
    else:
        body = {"model": api.model, "prompt": prompts, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
                **({"return_token_ids": True} if api.token_ids else {})}
        r = post(url, "/v1/completions", body)
        require(r.status_code == 200, f"POST /v1/completions (a batch) answered {r.status_code}: {r.text[:300]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        batch = [c.get("token_ids") if api.token_ids else c["text"] for c in choices]
    chat = openai_client(url).chat.completions.create(
        model=api.model, messages=[{"role": "user", "content": "Tell me about the sea."}], max_tokens=tokens,
        temperature=0, extra_body={"ignore_eos": True})
    return batch, chat.choices[0].message.content


@contract("HTTP-PARITY-FAST-PREFILL", SOURCE, rules=("H9", "F15"), needs=("http",))
def parity_fast_prefill(subject) -> None:
    """Greedy outputs through HTTP are the same with --kv-sharing-fast-prefill on and off (a batch through /generate
    and a chat completion), and the flag-on server really skipped cross-decoder rows."""
    prompts = [prompt_ids(20, 5), prompt_ids(21, 9), prompt_ids(22, 13)]
    url_on, url_off = subject.base_url(ARGV_ON), subject.base_url(ARGV_OFF)
    two = url_on != url_off  # one server at a URL (or a gateway without /metrics): parity only
    if not two:
        note("one server: its greedy outputs are checked for determinism only (give --subject-fast-prefill)")
    names = discover(url_on).metrics
    counter = names.skipped_rows if (two and names is not None) else None
    if two and counter is None:  # parity of a server that may ignore the flag proves nothing
        raise violation(f"the flag-on server {url_on} shows no fast prefill: its /metrics has no counter of the "
                        "cross-decoder rows it skipped (this project's yoco:skipped_cross_decoder_rows_total), so parity with the "
                        "flag-off server cannot tell fast prefill from a server that ignores the flag", project=True)
    skipped_before = total(scrape(url_on), counter) or 0.0 if counter else 0.0
    on = _outputs(url_on, prompts, 3)
    skipped = (total(scrape(url_on), counter) or 0.0) - skipped_before if counter else 0.0
    off = _outputs(url_off, prompts, 3)
    require(on == off, f"greedy outputs differ with fast prefill on vs off: on={on}, off={off}")
    if counter:
        require(skipped > 0, "the flag-on server skipped no cross-decoder rows while prefilling multi-token prompts: "
                             "fast prefill did not run, so the parity check proved nothing")
