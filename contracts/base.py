"""The contract layer: behaviour rules as executable checks against any subject.

A ``Contract`` is one rule: an id (``FLAG-DEFAULT-OFF``), the rule in one
sentence, its source (seed file and section), the rule ids of
``shared/design/RULES.md`` it covers, the subject capabilities it needs, and a
``check(subject)`` that raises ``ContractViolation`` with a message a user can
act on. Contracts know nothing of ``impl``: they talk to a ``Subject``.

Inside a check, ``require(cond, message)`` and ``violation(message)`` name the
contract being run: ``Contract.run`` sets it in a context variable, so no
contract id is threaded through helpers.

Invariants: ids are unique; every contract names at least one rule id and at
least one capability; every contract is killed by at least one mutant
(``contracts.mutants``), which ``spec/test_mutants.py`` proves.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

CAPABILITIES = frozenset({"args", "engine", "http", "cuda", "bench", "faults"})  # faults: generate_with_faults


class ContractViolation(AssertionError):
    """A subject broke a rule. The message says what was expected, what happened, and the fix."""

    def __init__(self, contract_id: str, message: str):
        super().__init__(f"[{contract_id}] {message}")
        self.contract_id = contract_id


@dataclass(frozen=True)
class Contract:
    id: str
    rule: str
    source: str
    rules: tuple[str, ...]
    needs: frozenset[str]
    check: Callable[[Any], None] = field(compare=False, repr=False)
    note: str = ""  # e.g. where SGLang 0.5.23 differs from the seed

    def __post_init__(self) -> None:
        if not self.rules:
            raise ValueError(f"contract {self.id} names no rule id")
        unknown = set(self.needs) - CAPABILITIES
        if unknown or not self.needs:
            raise ValueError(f"contract {self.id}: capabilities must be a non-empty subset of {sorted(CAPABILITIES)}")

    def run(self, subject: Any) -> None:
        with _running(self.id):
            self.check(subject)


_REGISTRY: dict[str, Contract] = {}
_CURRENT: ContextVar[str | None] = ContextVar("contract_id", default=None)


@contextlib.contextmanager
def _running(contract_id: str) -> Iterator[None]:
    token = _CURRENT.set(contract_id)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_contract_id() -> str:
    """The id of the contract whose check is running (set by ``Contract.run``)."""
    cid = _CURRENT.get()
    if cid is None:
        raise RuntimeError("require()/violation() called outside a contract check; run it through Contract.run")
    return cid


def contract(
    id: str,
    rule: str,
    source: str,
    rules: Iterable[str],
    needs: Iterable[str] = ("args",),
    note: str = "",
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``check(subject)`` as a contract; the decorated name runs it through ``Contract.run``.
    Inside, ``require(cond, message)`` or ``raise violation(message)`` fails it."""

    def deco(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if id in _REGISTRY:
            raise ValueError(f"duplicate contract id {id}")
        c = Contract(id, rule, source, tuple(rules), frozenset(needs), fn, note)
        _REGISTRY[id] = c

        @functools.wraps(fn)
        def run(subject: Any) -> None:
            c.run(subject)

        run.contract_id = id  # type: ignore[attr-defined]
        return run

    return deco


def violation(message: str) -> ContractViolation:
    """A ContractViolation of the running contract (raise it)."""
    return ContractViolation(current_contract_id(), message)


def require(cond: Any, message: str) -> None:
    """Fail the running contract with ``message`` unless ``cond``."""
    if not cond:
        raise violation(message)


def all_contracts() -> list[Contract]:
    import contracts

    discover(contracts)
    return sorted(_REGISTRY.values(), key=lambda c: c.id)


def get_contract(contract_id: str) -> Contract:
    all_contracts()
    return _REGISTRY[contract_id]


def discover(package: Any) -> None:
    """The one discovery rule for contract and mutant modules: import every module of ``package``
    (``contracts`` or ``contracts.mutants``); the ones that define contracts or mutants register them
    as they are imported, the rest (helpers) register nothing."""
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(package.__path__):
        if not m.ispkg and not m.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{m.name}")
