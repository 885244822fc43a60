"""Accept / reject expectations shared by the contracts; every failure is a ``violation`` of the
running contract (``contracts.base``).

``expect_*`` judge a ``CheckOutcome`` the caller already has; ``must_accept`` / ``must_reject`` run
``subject.check(argv_for(model, *flags), platform, env)`` first. Messages are compared after
lower-casing and mapping ``_`` to ``-`` (``norm``), so a message naming ``decode_attention_backend``
(the seed's assert) and one naming ``--decode-attention-backend`` both name the flag.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from contracts.base import violation
from contracts.models import E2B, argv_for
from contracts.subject import CheckOutcome

# The seed asserts some rules (AssertionError); we raise ValueError. Contracts accept either.
ASSERT_TYPES: tuple[type[BaseException], ...] = (ValueError, AssertionError)
VALUE_TYPES: tuple[type[BaseException], ...] = (ValueError,)
RUNTIME_TYPES: tuple[type[BaseException], ...] = (RuntimeError, ValueError)


def norm(text: str) -> str:
    return text.lower().replace("_", "-")


def expect_accepted(outcome: CheckOutcome, what: str) -> CheckOutcome:
    if outcome.error is not None:
        raise violation(f"{what} must be accepted, but the subject raised {type(outcome.error).__name__}: {outcome.error}")
    return outcome


def expect_rejected(
    outcome: CheckOutcome,
    what: str,
    mentions: Iterable[str] = (),
    types: tuple[type[BaseException], ...] = VALUE_TYPES,
) -> str:
    """The subject refused with one of ``types``; the message names every string in ``mentions``."""
    if outcome.error is None:
        raise violation(f"{what} must be rejected with {types[0].__name__}, but it was accepted")
    if not isinstance(outcome.error, types):
        names = " or ".join(t.__name__ for t in types)
        raise violation(f"{what}: decision conforms, message differs: it must raise {names}, got "
                        f"{type(outcome.error).__name__}: {outcome.error}", message_only=True)
    msg = str(outcome.error)
    missing = [m for m in mentions if norm(m) not in norm(msg)]
    if missing:
        raise violation(f"{what}: decision conforms, message differs: the error must name {missing} so the user "
                        f"can act on it; it said: {msg!r}", message_only=True)
    return msg


def expect_equal(actual: Any, expected: Any, what: str) -> None:
    if actual != expected:
        raise violation(f"{what}: expected {expected!r}, got {actual!r}")


def _what(flags: Sequence[str], model: str, platform: str, env: Mapping[str, str] | None) -> str:
    extra = f", env {dict(env)}" if env else ""
    return f"[{' '.join(flags)}] on {model} ({platform}{extra})"


def check(subject, flags: Sequence[str], model: str = E2B, platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
    return subject.check(argv_for(model, *flags), platform, env)


def must_reject(
    subject,
    flags: Sequence[str],
    mentions: Iterable[str],
    *,
    model: str = E2B,
    platform: str = "cpu",
    env: Mapping[str, str] | None = None,
    types: tuple[type[BaseException], ...] = ASSERT_TYPES,
) -> str:
    """``flags`` on ``model`` are refused with one of ``types``, naming every string in ``mentions``."""
    return expect_rejected(check(subject, flags, model, platform, env), _what(flags, model, platform, env), mentions, types)


def must_accept(
    subject,
    flags: Sequence[str],
    *,
    model: str = E2B,
    platform: str = "cpu",
    env: Mapping[str, str] | None = None,
) -> CheckOutcome:
    return expect_accepted(check(subject, flags, model, platform, env), _what(flags, model, platform, env))


def warnings_about(out: CheckOutcome, *needles: str) -> list[str]:
    """WARNING records whose message names every needle."""
    return [m for lv, m in out.log if lv == "WARNING" and all(norm(n) in norm(m) for n in needles)]
