"""The contract layer: behaviour rules as executable checks against any subject.

A ``Contract`` is one rule: an id (``FLAG-DEFAULT-OFF``), the rule in one
sentence, its source (seed file and section), the rule ids of
``docs/rules.md`` it covers, the subject capabilities it needs, and a
``check(subject)`` that raises ``ContractViolation`` with a message a user can
act on. Contracts know nothing of ``impl``: they talk to a ``Subject``.

Inside a check, ``require(cond, message)`` and ``violation(message)`` name the
contract being run: ``Contract.run`` sets it in a context variable, so no
contract id is threaded through helpers. ``not_applicable(reason)`` says the
subject cannot show what the rule is about (a route or counter it lacks): the
contract is then neither passed nor failed. ``note(text)`` records a remark on
a passing run (what was checked and what could not be), which the conformance
report prints as evidence.

Where a rule comes from: the seed rules (F*, K*) and this project's own (H*, S*,
E*, M*, T*, R*, THRU); ``stricter`` names what a contract asks beyond its seed rule
(this project's stricter choice), so a conformance report can tell a deviation
from the seed from a deviation from this project's choices.

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

# args: parse_args / cli_options / check; refuse: launch-time refusal; engine: generate; models: tiny_model (the
# project's tiny checkpoints); faults: generate_with_faults; http: base_url; bench: timed_generate / model_config;
# impl: this project's engine in process (mutants, startup-log snapshots, kernel providers); cuda: a CUDA device.
CAPABILITIES = frozenset({"args", "refuse", "engine", "models", "faults", "http", "bench", "impl", "cuda"})


class ContractViolation(AssertionError):
    """A subject broke a rule. The message says what was expected, what happened, and the fix."""

    def __init__(self, contract_id: str, message: str):
        super().__init__(f"[{contract_id}] {message}")
        self.contract_id = contract_id


class NotApplicable(Exception):
    """The subject cannot show what the rule is about (a route, counter or capability it lacks); the message is
    the reason. Neither a pass nor a failure: pytest skips, the conformance report says 'not applicable'."""


class CommandLineRefused(Exception):
    """The subject's command-line parser refused ``argv`` (an option it does not have, a bad value). Raised by
    adapters from ``parse_args`` / ``check``; ``Contract.run`` turns it into a violation of the running contract:
    an engine without an option fails every rule about that option, and never by accident passes one (an
    argparse refusal that happens to name the flag is not the rejection a rule asks for)."""

    def __init__(self, argv: Iterable[str], message: str):
        self.argv = list(argv)
        self.message = message
        super().__init__(f"{message} (command line: {' '.join(self.argv)})")


@dataclass(frozen=True)
class Contract:
    id: str
    rule: str
    source: str
    rules: tuple[str, ...]
    needs: frozenset[str]
    check: Callable[[Any], None] = field(compare=False, repr=False)
    note: str = ""  # e.g. where SGLang 0.5.23 differs from the seed
    stricter: str = ""  # what the contract asks beyond its seed rule (this project's own choice)

    def __post_init__(self) -> None:
        if not self.rules:
            raise ValueError(f"contract {self.id} names no rule id")
        unknown = set(self.needs) - CAPABILITIES
        if unknown or not self.needs:
            raise ValueError(f"contract {self.id}: capabilities must be a non-empty subset of {sorted(CAPABILITIES)}")

    @property
    def origin(self) -> str:
        """'seed 000', 'seed 004', 'seed 000 + project', or 'project' (rule ids beyond the seeds only)."""
        seeds = sorted({"seed 000" if r.startswith("F") else "seed 004" for r in self.rules if r[0] in "FK"})
        if not seeds:
            return "project"
        return " + ".join(seeds) + (" + project" if self.stricter or any(r[0] not in "FK" for r in self.rules) else "")

    def run(self, subject: Any) -> None:
        with _running(self.id):
            try:
                self.check(subject)
            except CommandLineRefused as e:
                raise ContractViolation(self.id, f"the subject's command line refused it: {e}") from e
            except Exception as e:
                if not _is_error_answer(e):
                    raise
                raise ContractViolation(self.id, f"the server answered a valid request with an error: {e}") from e


def _is_error_answer(e: BaseException) -> bool:
    """An HTTP error status a client library raised for a server's answer (httpx, the openai client): a verdict
    about the server, with its answer as evidence; connection failures are not (they stay harness errors)."""
    import httpx

    if isinstance(e, httpx.HTTPStatusError):
        return True
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a test extra
        return False
    return isinstance(e, openai.APIStatusError)


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
    stricter: str = "",
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``check(subject)`` as a contract; the decorated name runs it through ``Contract.run``.
    Inside, ``require(cond, message)`` or ``raise violation(message)`` fails it."""

    def deco(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if id in _REGISTRY:
            raise ValueError(f"duplicate contract id {id}")
        c = Contract(id, rule, source, tuple(rules), frozenset(needs), fn, note, stricter)
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


def not_applicable(reason: str) -> NotApplicable:
    """A NotApplicable for the running contract (raise it): the subject cannot show this rule, and why."""
    return NotApplicable(f"[{current_contract_id()}] {reason}")


_NOTES: ContextVar[list[str] | None] = ContextVar("contract_notes", default=None)


def note(text: str) -> None:
    """Record a remark on the running contract (what was checked, what the subject could not show); printed as
    evidence in a conformance report. Outside ``collect_notes`` it is dropped."""
    notes = _NOTES.get()
    if notes is not None and text not in notes:
        notes.append(text)


@contextlib.contextmanager
def collect_notes() -> Iterator[list[str]]:
    """The notes recorded by the contracts run inside the block."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


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
