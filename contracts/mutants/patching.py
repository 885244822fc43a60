"""Helpers for mutants: patch one attribute of the implementation around each call."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator

from contracts.subject import CheckOutcome, SubjectWrapper


@contextlib.contextmanager
def patched(target: str, value: Any) -> Iterator[None]:
    """``target`` is 'package.module:attr' or 'package.module:Class.attr'."""
    module_name, attr_path = target.split(":")
    obj = importlib.import_module(module_name)
    *parents, attr = attr_path.split(".")
    for p in parents:
        obj = getattr(obj, p)
    saved = obj.__dict__.get(attr, getattr(obj, attr)) if isinstance(obj, type) else getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, saved)


def original(module: str, attr: str) -> Any:
    """The unpatched ``module.attr`` (``attr`` may be ``Class.method``), looked up now."""
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class PatchedSubject(SubjectWrapper):
    """Runs every subject call with ``PATCHES`` (target -> replacement) applied."""

    PATCHES: dict[str, Any] = {}

    def _ctx(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for target, value in self.patches().items():
            stack.enter_context(patched(target, value))
        return stack

    def patches(self) -> dict[str, Any]:
        return dict(self.PATCHES)

    def parse_args(self, argv):
        with self._ctx():
            return self.inner.parse_args(argv)

    def check(self, argv, platform="cpu", env=None):
        with self._ctx():
            return self.inner.check(argv, platform, env)

    def generate(self, argv, requests, batched=True):
        with self._ctx():
            return self.inner.generate(argv, requests, batched)

    def timed_generate(self, argv, requests):
        with self._ctx():
            return self.inner.timed_generate(argv, requests)


class OutcomeMutant(SubjectWrapper):
    """Rewrites the outcome of ``check``: ``mutate(argv, outcome)`` returns the broken outcome."""

    def check(self, argv, platform="cpu", env=None) -> CheckOutcome:
        return self.mutate(list(argv), self.inner.check(argv, platform, env))

    def mutate(self, argv: list[str], out: CheckOutcome) -> CheckOutcome:
        raise NotImplementedError
