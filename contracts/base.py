"""The contract layer: behaviour rules as executable checks against any subject.

A ``Contract`` is one rule: an id (``FLAG-DEFAULT-OFF``), the rule in one
sentence, its source (seed file and section), the rule ids of
``shared/design/RULES.md`` it covers, the subject capabilities it needs, and a
``check(subject)`` that raises ``ContractViolation`` with a message a user can
act on. Contracts know nothing of ``impl``: they talk to a ``Subject``.

Invariants: ids are unique; every contract names at least one rule id and at
least one capability; every contract is killed by at least one mutant
(``contracts.mutants``), which ``spec/test_mutants.py`` proves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

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
        self.check(subject)

    def fail(self, message: str) -> ContractViolation:
        return ContractViolation(self.id, message)


_REGISTRY: dict[str, Contract] = {}


def contract(
    id: str,
    rule: str,
    source: str,
    rules: Iterable[str],
    needs: Iterable[str] = ("args",),
    note: str = "",
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``check(subject)`` as a contract. Use ``violation(...)`` inside to fail."""

    def deco(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if id in _REGISTRY:
            raise ValueError(f"duplicate contract id {id}")
        _REGISTRY[id] = Contract(id, rule, source, tuple(rules), frozenset(needs), fn, note)
        fn.contract_id = id  # type: ignore[attr-defined]
        return fn

    return deco


def violation(contract_id: str, message: str) -> ContractViolation:
    return ContractViolation(contract_id, message)


def require(cond: Any, contract_id: str, message: str) -> None:
    if not cond:
        raise ContractViolation(contract_id, message)


def all_contracts() -> list[Contract]:
    from contracts import catalogue  # noqa: F401  (imports every contract module)

    return sorted(_REGISTRY.values(), key=lambda c: c.id)


def get_contract(contract_id: str) -> Contract:
    all_contracts()
    return _REGISTRY[contract_id]
