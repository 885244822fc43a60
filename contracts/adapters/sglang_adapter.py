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

import builtins
import hashlib
import json
import os
import subprocess
import tempfile
import threading
from typing import Any, Mapping, Sequence

from contracts.base import CommandLineRefused
from contracts.subject import CheckOutcome, OptionInfo

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_bridge.py")
DEFAULT_VENV = os.path.join(REPO_ROOT, ".cache", "sglang-venv")
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


def _rebuild(err: dict[str, Any]) -> BaseException:
    """SGLang's exception as a local one: its own class name over its nearest builtin base (so ValueError /
    RuntimeError / AssertionError checks hold), with its message."""
    base = next((getattr(builtins, b) for b in err["bases"] if isinstance(getattr(builtins, b, None), type)
                 and issubclass(getattr(builtins, b), Exception)), Exception)
    cls = base if err["type"] == base.__name__ else type(err["type"], (base,), {"__module__": "sglang"})
    return cls(err["message"])


class BridgeError(RuntimeError):
    """The bridge itself failed (not SGLang's verdict on a command line)."""


class SglangSubject:
    """SGLang's argument code as an ``args`` subject (no engine: SGLang's engine needs a GPU)."""

    capabilities = frozenset({"args"})
    env_prefix = "SGLANG_"

    def __init__(self, venv: str | None = None):
        self.venv = os.path.abspath(venv or os.environ.get("SGLANG_VENV") or DEFAULT_VENV)
        self.python = os.path.join(self.venv, "bin", "python")
        if not os.path.exists(self.python):
            raise FileNotFoundError(f"--subject sglang needs SGLang's virtualenv at {self.venv} (none there): build it "
                                    "with `make conformance-sglang` (or point SGLANG_VENV at one)")
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.version = "?"
        self.name = "sglang"
        self._options: dict[str, OptionInfo] | None = None

    def describe(self) -> str:
        self.cli_options()  # starts the bridge, which reports SGLang's version
        return f"SGLang {self.version} (ServerArgs and its resolution pipeline, in process through {os.path.relpath(BRIDGE, REPO_ROOT)})"

    # ---- the pipe ------------------------------------------------------------------
    def _start(self) -> subprocess.Popen:
        self._log = open(os.path.join(tempfile.gettempdir(), f"yoco-sglang-bridge-{os.getuid()}.log"), "a")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        proc = subprocess.Popen([self.python, BRIDGE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self._log, text=True, env=env, cwd=tempfile.gettempdir())
        ready = proc.stdout.readline()
        if not ready:
            raise BridgeError(f"the SGLang bridge exited with {proc.wait()} before it was ready; see {self._log.name}")
        self.version = json.loads(ready)["version"]
        self.name = f"sglang-{self.version}"
        return proc

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise BridgeError(f"the SGLang bridge died answering {req['op']}; see {self._log.name}")
        answer = json.loads(line)
        if "bridge_error" in answer:
            e = answer["bridge_error"]
            raise BridgeError(f"the SGLang bridge failed on {req}: {e['type']}: {e['message']}\n{e['where']}")
        return answer

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(30)

    # ---- args ------------------------------------------------------------------------
    def parse_args(self, argv: Sequence[str]) -> dict[str, Any]:
        argv = _translate(argv)
        answer = self._call({"op": "parse", "argv": argv})
        if "refused" in answer:
            raise CommandLineRefused(argv, answer["refused"])
        return answer["args"]

    def cli_options(self) -> Mapping[str, OptionInfo]:
        if self._options is None:
            opts = self._call({"op": "options"})["options"]
            self._options = {o["option"]: OptionInfo(o["option"], o["dest"], o["action"], o["default"], o["help"]) for o in opts}
        return self._options

    def check(self, argv: Sequence[str], platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
        argv = _translate(argv)
        sg_env = {("SGLANG_" + k[len("YOCO_"):] if k.startswith("YOCO_") else k): v for k, v in (env or {}).items()}
        answer = self._call({"op": "check", "argv": argv, "platform": platform, "env": sg_env})
        if "refused" in answer:
            raise CommandLineRefused(argv, answer["refused"])
        return CheckOutcome(
            user=answer["user"],
            resolved=answer["resolved"],
            resolutions=[tuple(r) for r in answer["resolutions"]],
            log=[tuple(r) for r in answer["log"]],
            model_config=answer["model_config"],
            error=_rebuild(answer["error"]) if answer["error"] else None,
        )
