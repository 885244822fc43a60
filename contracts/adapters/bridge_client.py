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
from typing import Any


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
    engine = "?"
    bridge = ""
    venv_variable = ""
    default_venv = ""
    make_target = ""

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

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait(30)
