"""The contracts' SGLang command lines in vLLM's options: the translation table of the ``vllm`` subject.

The contracts speak SGLang's options (``--model-path``, ``--speculative-algorithm`` + a draft,
``--attention-backend triton``). Each option with a vLLM counterpart is translated; one without (the seed-004
KV-cache options, split prefill / decode backends, ...) is refused in argparse's words ("unrecognized arguments"),
so a contract about that option is out of scope for vLLM and one that merely uses it is inconclusive
(``contracts.base.Contract.judge_refusal``). ``resolved_in_sglang_terms`` maps vLLM's resolved values back (the
backend's name, the speculative method) so the contracts compare like with like.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

# SGLang attention backend -> vLLM's AttentionBackendEnum name (the backends both have).
BACKENDS = {
    "triton": "TRITON_ATTN",
    "torch_native": "CPU_ATTN",
    "flashinfer": "FLASHINFER",
    "fa3": "FLASH_ATTN",
    "flex_attention": "FLEX_ATTENTION",
}
# SGLang --speculative-algorithm -> vLLM's SpeculativeConfig.method (NEXTN: Gemma-4's MTP assistant is gemma4_mtp,
# method "mtp", in vLLM).
SPEC_METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model", "NGRAM": "ngram"}
SPEC_TOKENS = 2  # num_speculative_tokens: vLLM requires it; the seed's rules do not depend on it
# vLLM's EAGLE / EAGLE3 need a draft model ("num_speculative_tokens was provided but without speculative model"),
# where SGLang's fast-prefill rule (F10 / F11) is decided before any draft is read: a command line with EAGLE and no
# draft gets an EAGLE head for the target (a config-only fixture of contracts/models.py), which vLLM accepts
# without the flag, so the flag's own decision is what the contract sees.
EAGLE_DRAFTS = {"eagle": "EAGLE-gemma-4-E2B-it", "eagle3": "EAGLE3-gemma-4-E2B-it"}

# Options spelled the same (a value or a switch) in both engines.
SAME = {"--kv-sharing-fast-prefill": False, "--dtype": True, "--trust-remote-code": False, "--max-num-seqs": True}
# The server's own options (vLLM's API server, not its engine arguments): nothing the configuration sees.
SERVER_ONLY = {"--port": True, "--host": True}
# SGLang option -> (vLLM option, takes a value).
RENAMED = {"--model-path": ("--model", True), "--model": ("--model", True), "--context-length": ("--max-model-len", True),
           "--max-running-requests": ("--max-num-seqs", True), "--disable-radix-cache": ("--no-enable-prefix-caching", False),
           "--chunked-prefill-size": ("--max-num-batched-tokens", True)}
SPEC_OPTIONS = ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps")


@dataclass(frozen=True)
class Translation:
    argv: list[str]  # vLLM's command line
    lacking: list[str]  # SGLang options with no vLLM counterpart (refused as unrecognized arguments)
    bad_values: list[tuple[str, str]]  # (option, value) with no vLLM counterpart


def translate(argv: Sequence[str]) -> Translation:
    out: list[str] = []
    lacking: list[str] = []
    bad: list[tuple[str, str]] = []
    spec: dict[str, str] = {}
    i = 0
    args = list(argv)
    while i < len(args):
        opt = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        if opt in SPEC_OPTIONS:
            spec[opt] = value or ""
            i += 2
            continue
        if opt == "--attention-backend":
            if value in BACKENDS:
                out += [opt, BACKENDS[value]]
            else:
                bad.append((opt, str(value)))
            i += 2
            continue
        if opt in SERVER_ONLY:
            i += 2 if SERVER_ONLY[opt] else 1
            continue
        if opt in SAME:
            takes = SAME[opt]
            out += [opt, *([value] if takes and value is not None else [])]
            i += 2 if takes else 1
            continue
        if opt in RENAMED:
            new, takes = RENAMED[opt]
            out += [new, *([value] if takes and value is not None else [])]
            i += 2 if takes else 1
            continue
        lacking.append(opt)
        i += 2 if value is not None else 1
    if spec:
        algo = spec.get("--speculative-algorithm", "")
        method = SPEC_METHODS.get(algo)
        if method is None:
            bad.append(("--speculative-algorithm", algo))
        else:
            cfg: dict[str, object] = {"method": method, "num_speculative_tokens": SPEC_TOKENS}
            if spec.get("--speculative-draft-model-path"):
                cfg["model"] = spec["--speculative-draft-model-path"]
            elif method in EAGLE_DRAFTS:
                from contracts.models import model_dir

                cfg["model"] = model_dir(EAGLE_DRAFTS[method])
            out += ["--speculative-config", json.dumps(cfg)]
    return Translation(out, lacking, bad)


def refusal(t: Translation) -> str | None:
    """argparse's words for what the table cannot translate, or None."""
    if t.lacking:
        return (f"vllm serve: error: unrecognized arguments: {' '.join(t.lacking)} (no vLLM counterpart in "
                "contracts/adapters/vllm_options.py)")
    if t.bad_values:
        opt, value = t.bad_values[0]
        return f"vllm serve: error: argument {opt}: invalid choice: {value!r} (no vLLM counterpart)"
    return None


def resolved_in_sglang_terms(resolved: dict[str, object]) -> dict[str, object]:
    """vLLM's resolved values under SGLang's names where the contracts read them."""
    out = dict(resolved)
    back = {v: k for k, v in BACKENDS.items()}
    backend = resolved.get("attention_backend")
    out["attention_backend"] = back.get(str(backend), backend) if backend is not None else None
    methods = {v: k for k, v in SPEC_METHODS.items()}
    method = resolved.get("speculative_method")
    out["speculative_algorithm"] = methods.get(str(method), method) if method is not None else None
    return out
