"""The project side of a bridge: one long-lived process in another engine's virtualenv, asked through a pipe.

``SglangSubject`` and ``VllmSubject`` run their engine's own argument code this way (``sglang_bridge.py``,
``vllm_bridge.py``): the spec run stays in the project's environment, the engine in its own, and they talk JSON
lines (one request, one answer). A failure of the bridge itself is a ``BridgeError`` (a harness error, never a
verdict about the engine).
"""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import tempfile
import threading
from typing import Any, Mapping, Sequence

from contracts.base import CommandLineRefused
from contracts.subject import CheckOutcome, OptionInfo


class BridgeError(RuntimeError):
    """The bridge itself failed (not the engine's verdict on a command line)."""


def rebuild_error(err: dict[str, Any]) -> BaseException:
    """The engine's exception as a local one: its own class name over its nearest builtin base (so ValueError /
    RuntimeError / AssertionError checks hold), with its message."""
    base = next((getattr(builtins, b) for b in err["bases"] if isinstance(getattr(builtins, b, None), type)
                 and issubclass(getattr(builtins, b), Exception)), Exception)
    cls = base if err["type"] == base.__name__ else type(err["type"], (base,), {"__module__": "engine"})
    return cls(err["message"])


class BridgedSubject:
    """An ``args`` subject whose answers come from ``bridge`` run by the Python of ``$<venv_variable>``."""

    capabilities = frozenset({"args"})
    engine = "?"  # the engine's name, as its project writes it
    # Set from ``tag``, the engine's name in lower case (``sglang``): the bridge (``<tag>_bridge.py`` beside this
    # file), the virtualenv (``$<TAG>_VENV``, else ``.cache/<tag>-venv``), the make target that builds it, and the
    # prefix of the engine's environment switches (this project's ``YOCO_*`` are renamed to it).
    tag = ""
    bridge = ""
    venv_variable = ""
    default_venv = ""
    make_target = ""
    env_prefix = "YOCO_"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        here = os.path.dirname(os.path.abspath(__file__))
        cls.bridge = os.path.join(here, f"{cls.tag}_bridge.py")
        cls.venv_variable = f"{cls.tag.upper()}_VENV"
        cls.default_venv = os.path.join(os.path.dirname(os.path.dirname(here)), ".cache", f"{cls.tag}-venv")
        cls.make_target = f"make conformance-{cls.tag}"
        cls.env_prefix = f"{cls.tag.upper()}_"

    def __init__(self, venv: str | None = None):
        self.venv = os.path.abspath(venv or os.environ.get(self.venv_variable) or self.default_venv)
        self.python = os.path.join(self.venv, "bin", "python")
        if not os.path.exists(self.python):
            raise FileNotFoundError(f"this subject needs {self.engine}'s virtualenv at {self.venv} (none there): build "
                                    f"it with `{self.make_target}` (or point {self.venv_variable} at one)")
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.version = "?"
        self.name = self.engine.lower()
        self._options: dict[str, Any] | None = None

    def _start(self) -> subprocess.Popen:
        tag = self.engine.lower()
        self._log = open(os.path.join(tempfile.gettempdir(), f"yoco-{tag}-bridge-{os.getuid()}.log"), "a")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        env.pop(self.venv_variable, None)  # the spec's setting, not the engine's (vLLM warns of unknown VLLM_*)
        proc = subprocess.Popen([self.python, self.bridge], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self._log, text=True, env=env, cwd=tempfile.gettempdir())
        ready = proc.stdout.readline()  # type: ignore[union-attr]
        if not ready:
            raise BridgeError(f"the {self.engine} bridge exited with {proc.wait()} before it was ready; see {self._log.name}")
        self.version = json.loads(ready)["version"]
        self.name = f"{tag}-{self.version}"
        return proc

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            self._proc.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            line = self._proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise BridgeError(f"the {self.engine} bridge died answering {req['op']}; see {self._log.name}")
        answer = json.loads(line)
        if "bridge_error" in answer:
            e = answer["bridge_error"]
            raise BridgeError(f"the {self.engine} bridge failed on {req}: {e['type']}: {e['message']}\n{e['where']}")
        return answer

    def _answer(self, req: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
        """The bridge's answer to ``req`` about ``argv`` (what the engine was given); its refusal of the command line
        raises ``CommandLineRefused``."""
        answer = self._call(req)
        if "refused" in answer:
            raise CommandLineRefused(argv, answer["refused"])
        return answer

    def engine_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """``env`` with this project's ``YOCO_*`` switches under the engine's own prefix."""
        return {(self.env_prefix + k[len("YOCO_"):] if k.startswith("YOCO_") else k): v for k, v in (env or {}).items()}

    @staticmethod
    def outcome(answer: dict[str, Any], user: dict[str, Any] | None = None,
                resolved: dict[str, Any] | None = None) -> CheckOutcome:
        """A bridge's ``check`` answer as a ``CheckOutcome`` (``user`` / ``resolved``: the answer's, translated)."""
        return CheckOutcome(
            user=answer["user"] if user is None else user,
            resolved=answer["resolved"] if resolved is None else resolved,
            resolutions=[tuple(r) for r in answer["resolutions"]],
            log=[tuple(r) for r in answer["log"]],
            model_config=answer["model_config"],
            error=rebuild_error(answer["error"]) if answer["error"] else None,
        )

    def cli_options(self) -> Mapping[str, OptionInfo]:
        if self._options is None:
            opts = self._call({"op": "options"})["options"]
            self._options = {o["option"]: OptionInfo(o["option"], o["dest"], o["action"], o["default"], o["help"]) for o in opts}
        return self._options

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait(30)
