"""Small assertion helpers shared by contracts; every failure is a ContractViolation."""

from __future__ import annotations

from typing import Iterable

from contracts.base import ContractViolation
from contracts.subject import CheckOutcome


def expect_accepted(outcome: CheckOutcome, cid: str, what: str) -> None:
    if outcome.error is not None:
        raise ContractViolation(cid, f"{what} must be accepted, but the subject raised {type(outcome.error).__name__}: {outcome.error}")


def expect_rejected(
    outcome: CheckOutcome,
    cid: str,
    what: str,
    mentions: Iterable[str] = (),
    types: tuple[type[BaseException], ...] = (ValueError,),
) -> str:
    """The subject refused with one of ``types``; the message names every string in ``mentions``."""
    if outcome.error is None:
        raise ContractViolation(cid, f"{what} must be rejected at startup with {types[0].__name__}, but it was accepted")
    if not isinstance(outcome.error, types):
        raise ContractViolation(
            cid, f"{what} must raise {' or '.join(t.__name__ for t in types)}, got {type(outcome.error).__name__}: {outcome.error}"
        )
    msg = str(outcome.error)
    missing = [m for m in mentions if m.lower() not in msg.lower()]
    if missing:
        raise ContractViolation(cid, f"{what}: the error must name {missing} so the user can act on it; it said: {msg!r}")
    return msg


def expect_equal(actual, expected, cid: str, what: str) -> None:
    if actual != expected:
        raise ContractViolation(cid, f"{what}: expected {expected!r}, got {actual!r}")
