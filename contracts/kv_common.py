"""Shared helpers of the seed-004 (KV-cache dtype and pool) contracts. Defines no contract.

Every check goes through ``subject.check(argv, platform, env)``. Messages are
compared after lower-casing and mapping ``_`` to ``-``, so a message naming
``decode_attention_backend`` (the seed's assert) and one naming
``--decode-attention-backend`` both name the flag.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from contracts.base import ContractViolation, require  # noqa: F401  (re-exported for the kv_* contracts)
from contracts.models import argv_for
from contracts.subject import CheckOutcome

SEED = "seeds/004"
E2B = "gemma-4-E2B-it"  # MHA, hybrid sliding window, uniform K/V rows per layer type
DSV3 = "DeepSeek-V3"  # MLA
LLAMA = "Llama-3.1-8B-Instruct"  # MHA, full attention only
MIMO = "MiMo-V2-Flash"  # MHA, K/V rows 192 / 128
MLA_SWA = "MLA-hybrid-SWA-test"  # MLA with sliding-window layers

# The environment switch that disables lazy compaction (SGLang: SGLANG_DISABLE_LAZY_COMPACTION).
LAZY_COMPACTION_ENV = "YOCO_DISABLE_LAZY_COMPACTION"

# The seed asserts some rules (AssertionError); we raise ValueError. Contracts accept either.
ASSERT_TYPES: tuple[type[BaseException], ...] = (ValueError, AssertionError)
VALUE_TYPES: tuple[type[BaseException], ...] = (ValueError,)
RUNTIME_TYPES: tuple[type[BaseException], ...] = (RuntimeError, ValueError)

UM = ("--enable-unified-memory",)
UM_TRITON = ("--enable-unified-memory", "--attention-backend", "triton")
PREFILL_ONLY_OK = (
    "--prefill-only-disable-kv-cache",
    "--is-embedding",
    "--chunked-prefill-size",
    "-1",
    "--disable-radix-cache",
    "--attention-backend",
    "fa3",
)


def norm(text: str) -> str:
    return text.lower().replace("_", "-")


def _what(flags: Sequence[str], model: str, platform: str, env: Mapping[str, str] | None) -> str:
    extra = f", env {dict(env)}" if env else ""
    return f"[{' '.join(flags)}] on {model} ({platform}{extra})"


def check(subject, flags: Sequence[str], model: str = E2B, platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
    return subject.check(argv_for(model, *flags), platform, env)


def must_reject(
    subject,
    cid: str,
    flags: Sequence[str],
    mentions: Iterable[str],
    *,
    model: str = E2B,
    platform: str = "cpu",
    env: Mapping[str, str] | None = None,
    types: tuple[type[BaseException], ...] = ASSERT_TYPES,
) -> str:
    """The subject refuses with one of ``types`` and the message names every string in ``mentions``."""
    out = check(subject, flags, model, platform, env)
    what = _what(flags, model, platform, env)
    if out.error is None:
        raise ContractViolation(cid, f"{what} must be rejected with {types[0].__name__}, but it was accepted")
    if not isinstance(out.error, types):
        names = " or ".join(t.__name__ for t in types)
        raise ContractViolation(cid, f"{what} must raise {names}, got {type(out.error).__name__}: {out.error}")
    msg = str(out.error)
    missing = [m for m in mentions if norm(m) not in norm(msg)]
    if missing:
        raise ContractViolation(cid, f"{what}: the error must name {missing} so the user can act on it; it said: {msg!r}")
    return msg


def must_accept(
    subject,
    cid: str,
    flags: Sequence[str],
    *,
    model: str = E2B,
    platform: str = "cpu",
    env: Mapping[str, str] | None = None,
) -> CheckOutcome:
    out = check(subject, flags, model, platform, env)
    if out.error is not None:
        raise ContractViolation(
            cid, f"{_what(flags, model, platform, env)} must be accepted, but the subject raised "
            f"{type(out.error).__name__}: {out.error}"
        )
    return out


def warnings_about(out: CheckOutcome, *needles: str) -> list[str]:
    """WARNING records whose message names every needle."""
    return [m for lv, m in out.log if lv == "WARNING" and all(norm(n) in norm(m) for n in needles)]
