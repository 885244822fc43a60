"""The ``sglang`` subject: SGLang's own server-argument code (``ServerArgs``, its resolution pipeline and
``sglang/srt/arg_groups/kv_cache_hook.py``), in process in SGLang's virtualenv, behind a pipe.

``pytest spec --subject sglang`` runs the ``args`` contracts against the SGLang installed in ``$SGLANG_VENV``
(default ``.cache/sglang-venv``; ``make conformance-sglang`` builds it with sglang 0.5.23). The virtualenv is
never a project dependency: the spec run stays in the project's environment and talks to one long-lived
``sglang_bridge.py`` process in SGLang's (JSON lines; see that file). What the adapter adds on this side:

* model folders: each ``--model-path`` / ``--speculative-draft-model-path`` folder whose ``config.json`` is a
  text-only Gemma-4 config (``gemma4_text``) is served to SGLang as a copy in the multimodal ``gemma4`` layout
  (``Gemma4ForConditionalGeneration`` with the text model under ``text_config``), the layout 0.5.23's config
  parser reads; the copy keeps the folder's name, so log lines name the model as an operator would see it;
* environment switches: this project's ``YOCO_`` names map to SGLang's ``SGLANG_`` (``env_prefix``);
* every ``check`` builds a new record (a resolved ``ServerArgs`` is sealed, a failed one cannot be retried);
* a command line ``sglang serve``'s parser refuses (an option 0.5.23 does not have, such as
  ``--kv-sharing-fast-prefill``) raises ``CommandLineRefused``: the contract fails and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Mapping, Sequence

from contracts.adapters.bridge_client import BridgedSubject
from contracts.subject import CheckOutcome

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_FLAGS = ("--model-path", "--model", "--speculative-draft-model-path")


def sglang_layout(path: str) -> str:
    """``path`` itself, or (for a text-only Gemma-4 config) a copy of its config in the multimodal layout."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return path
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "gemma4_text":
        return path
    wrapped = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": cfg,
        "vision_config": {"model_type": "gemma4_vision"},
    }
    name = os.path.basename(os.path.normpath(path))
    root = os.path.join(tempfile.gettempdir(), f"yoco-sglang-layout-{os.getuid()}", hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12])
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    target = os.path.join(out, "config.json")
    text = json.dumps(wrapped, indent=1)
    if not os.path.isfile(target) or open(target).read() != text:
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    return out


def _translate(argv: Sequence[str]) -> list[str]:
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a in MODEL_FLAGS:
            out[i + 1] = sglang_layout(out[i + 1])
    return out


class SglangSubject(BridgedSubject):
    """SGLang's argument code as an ``args`` subject (no engine: SGLang's engine needs a GPU)."""

    engine = "SGLang"
    tag = "sglang"

    def describe(self) -> str:
        self.cli_options()  # starts the bridge, which reports SGLang's version
        return f"SGLang {self.version} (ServerArgs and its resolution pipeline, in process through {os.path.relpath(self.bridge, REPO_ROOT)})"

    # ---- args ------------------------------------------------------------------------
    def parse_args(self, argv: Sequence[str]) -> dict[str, Any]:
        argv = _translate(argv)
        return self._answer({"op": "parse", "argv": argv}, argv)["args"]

    def check(self, argv: Sequence[str], platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
        argv = _translate(argv)
        return self.outcome(self._answer({"op": "check", "argv": argv, "platform": platform,
                                          "env": self.engine_env(env)}, argv))
