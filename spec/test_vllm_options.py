"""The ``vllm`` subject's translation table (``contracts/adapters/vllm_options.py``), without vLLM."""

from __future__ import annotations

import json
import os

from contracts.adapters.vllm_options import EAGLE_DRAFTS, refusal, translate
from contracts.models import argv_for


def _spec_config(argv: list[str]) -> dict:
    t = translate(argv)
    assert refusal(t) is None
    return json.loads(t.argv[t.argv.index("--speculative-config") + 1])


def test_eagle_without_a_draft_gets_an_eagle_head_for_the_target():
    # vLLM's EAGLE needs a draft model; SGLang's F10 / F11 do not read one, so the translation supplies it
    for algo, method in (("EAGLE", "eagle"), ("EAGLE3", "eagle3")):
        cfg = _spec_config(argv_for("gemma-4-E2B-it", "--kv-sharing-fast-prefill", "--speculative-algorithm", algo))
        assert cfg["method"] == method and os.path.basename(cfg["model"]) == EAGLE_DRAFTS[method]
        with open(os.path.join(cfg["model"], "config.json")) as f:
            assert json.load(f)["model_type"] == "llama"


def test_a_given_draft_is_kept_and_nextn_gets_no_eagle_head():
    cfg = _spec_config(argv_for("gemma-4-E2B-it", "--speculative-algorithm", "EAGLE", draft="Llama-3.1-8B-Instruct"))
    assert os.path.basename(cfg["model"]) == "Llama-3.1-8B-Instruct"
    cfg = _spec_config(argv_for("gemma-4-E2B-it", "--speculative-algorithm", "NEXTN"))
    assert cfg == {"method": "mtp", "num_speculative_tokens": 2}
