"""Mutants: deliberately broken subjects. Each names the contracts it must make fail.

``spec/test_mutants.py`` runs every contract against every mutant that claims
to kill it and requires a ContractViolation; a contract no mutant kills is a
defect (``spec/test_catalogue.py`` checks each contract has one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from contracts.subject import SubjectWrapper


@dataclass(frozen=True)
class Mutant:
    name: str
    kills: tuple[str, ...]
    make: Callable[[Any], Any]
    doc: str


_MUTANTS: dict[str, Mutant] = {}


def mutant(*kills: str) -> Callable[[type], type]:
    """Register a SubjectWrapper subclass as a mutant killing ``kills``."""

    def deco(cls: type) -> type:
        if not issubclass(cls, SubjectWrapper):
            raise TypeError("mutants wrap a subject")
        _MUTANTS[cls.__name__] = Mutant(cls.__name__, tuple(kills), cls, (cls.__doc__ or "").strip())
        return cls

    return deco


def all_mutants() -> list[Mutant]:
    import contracts.mutants
    from contracts.base import discover

    discover(contracts.mutants)
    return sorted(_MUTANTS.values(), key=lambda m: m.name)
