"""The contract layer: behaviour rules as executable checks against any subject.

A ``Contract`` is one rule: an id (``FLAG-DEFAULT-OFF``), the rule in one
sentence (the check's docstring), its source (seed file and section), the rule ids of
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

Verdicts (``contracts.conformance`` writes them): pass; fail of a seed rule or of
this project's stricter rule (``violation(..., project=True)``; a contract whose
rule ids are all this project's always fails a project rule), or "decision
conforms, message differs" (``message_only=True``); out of scope (``OutOfScope``:
the subject lacks an option the rule is about, which each contract declares in
``options``); not reached (``NotReached``: a capability this kind of subject
lacks, and the kinds that have it); inconclusive (``Inconclusive``: noise, or a
refusal of an option the rule is not about, with the evidence). A missing feature
the rule is about (a route, a metric) is a failure, not any of these. A server
that stops answering (a crash) fails the running contract.

``case(label)`` runs one case of a contract: a violation inside it is collected
and the contract goes on to its next case; ``Contract.run`` then fails with every
collected case. A case that was out of scope or inconclusive is recorded too: the
contract passes partially when others passed, and takes that verdict when none ran.

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
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

# args: parse_args / cli_options / check; refuse: launch-time refusal; engine: generate; models: tiny_model (the
# project's tiny checkpoints); faults: generate_with_faults; http: base_url; bench: timed_generate / model_config;
# impl: this project's engine in process (mutants, startup-log snapshots, kernel providers); cuda: a CUDA device.
CAPABILITIES = frozenset({"args", "refuse", "engine", "models", "faults", "http", "bench", "impl", "cuda"})


class ContractViolation(AssertionError):
    """A subject broke a rule. The message says what was expected, what happened, and the fix.

    ``project``: the case broken is this project's stricter choice, not the seed's rule. ``message_only``: the
    subject made the seed's decision (it refused, with the right type) but its message lacks the seed's words."""

    def __init__(self, contract_id: str, message: str, project: bool = False, message_only: bool = False):
        super().__init__(f"[{contract_id}] {message}")
        self.contract_id = contract_id
        self.project = project
        self.message_only = message_only


class NotApplicable(Exception):
    """Neither a pass nor a failure: pytest skips with ``verdict: reason``, and the conformance report gives
    that verdict. Raise one of the subclasses, which say why."""

    verdict = "inconclusive"


class OutOfScope(NotApplicable):
    """The subject lacks an option the rule is about (``options``): the rule says nothing about this engine."""

    verdict = "out of scope"

    def __init__(self, message: str, options: Iterable[str] = ()):
        super().__init__(message)
        self.options = tuple(options)


class NotReached(NotApplicable):
    """This kind of subject lacks a capability the rule needs (``capability``); ``kinds`` would reach it."""

    verdict = "not reached"

    def __init__(self, message: str, capability: str = "", kinds: Iterable[str] = ()):
        super().__init__(message)
        self.capability = capability
        self.kinds = tuple(kinds)


class Inconclusive(NotApplicable):
    """The run shows nothing about the rule: noise beyond the threshold's margin, or a refusal of something the
    rule is not about. The message is the evidence."""

    verdict = "inconclusive"


class CommandLineRefused(Exception):
    """The subject's command-line parser refused ``argv`` (an option it does not have, a bad value). Raised by
    adapters from ``parse_args`` / ``check``; ``Contract.run`` turns it into a violation of the running contract:
    an engine without an option fails every rule about that option, and never by accident passes one (an
    argparse refusal that happens to name the flag is not the rejection a rule asks for)."""

    def __init__(self, argv: Iterable[str], message: str):
        self.argv = list(argv)
        self.message = message
        super().__init__(f"{message} (command line: {' '.join(self.argv)})")


def without_options(argv: Iterable[str], prefix: str) -> list[str]:
    """``argv`` less every option that starts with ``prefix`` and its value (``--opt value``; ``--opt=value``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a.startswith(prefix):
            skip = "=" not in a
        else:
            out.append(a)
    return out


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
    # the command-line options the rule is about: a subject without one of them is out of scope; a refusal of
    # any other option is inconclusive (the rule is not about it)
    options: tuple[str, ...] = ()

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

    @property
    def project_only(self) -> bool:
        """Every rule id is this project's (no seed rule): any failure is of a project rule."""
        return self.origin == "project"

    def run(self, subject: Any) -> None:
        with _running(self.id), _collecting() as cases:
            try:
                self.check(subject)
            except Exception as e:
                judged = _judged(self, e)
                if cases.failed and isinstance(judged, (ContractViolation, NotApplicable)):
                    # the cases collected before this one fail the contract too
                    if isinstance(judged, ContractViolation):
                        cases.failed.append(judged)
                    cases.finish(self.id)
                if judged is e:
                    raise
                raise judged from e
            cases.finish(self.id)

    def judge_refusal(self, e: CommandLineRefused) -> Exception:
        """A parser's refusal as a verdict: an option the rule is about that the subject lacks is out of scope;
        an option the rule is not about (lacking, or a value refused) is inconclusive; a refused value of an
        option the rule is about (or a refusal that names no option) fails the rule."""
        text = e.message
        lacking = re.findall(r"--[\w-]+", text.split("unrecognized arguments:", 1)[1]) if "unrecognized arguments:" in text else []
        refused_value = re.findall(r"argument (--[\w-]+)", text)
        if self.options and lacking:
            about = [o for o in lacking if o in self.options]
            if about:
                return OutOfScope(f"[{self.id}] the subject has no {', '.join(about)}, which this rule is about: {e}", about)
            return Inconclusive(f"[{self.id}] refused {', '.join(lacking)}, which this rule is not about: {e}")
        if self.options and refused_value and not set(refused_value) & set(self.options):
            return Inconclusive(f"[{self.id}] refused a value of {', '.join(refused_value)}, which this rule is not "
                                f"about: {e}")
        return ContractViolation(self.id, f"the subject's command line refused it: {e}")


def _judged(c: Contract, e: Exception) -> Exception:
    """What an exception out of a check means for contract ``c``: a violation, a skip verdict, or itself (a
    harness error)."""
    if isinstance(e, (ContractViolation, NotApplicable)):
        return e
    if isinstance(e, CommandLineRefused):
        return c.judge_refusal(e)
    if _is_error_answer(e):
        return ContractViolation(c.id, f"the server answered a valid request with an error: {e}")
    if _is_server_gone(e):
        return ContractViolation(c.id, f"the server stopped answering (crashed or closed the connection) while the "
                                       f"contract ran: {type(e).__name__}: {e}")
    return e


def _is_server_gone(e: BaseException) -> bool:
    """A server that accepted the connection before and now closes it or refuses it: httpx's transport errors
    other than a connect timeout, the openai client's connection error, or a launched server that exited."""
    import httpx

    if isinstance(e, httpx.TransportError) and not isinstance(e, httpx.ConnectTimeout):
        return True
    if isinstance(e, RuntimeError) and " exited with " in str(e) and "before it was ready" in str(e):
        return True  # contracts.adapters.impl_http: the launched server crashed at startup
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a test extra
        return False
    return isinstance(e, openai.APIConnectionError)


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


@dataclass
class CaseLog:
    """The cases of one contract run (``case``): the violations collected, the cases skipped with their
    verdict, and how many cases passed."""

    failed: list[ContractViolation] = field(default_factory=list)
    skipped: list[NotApplicable] = field(default_factory=list)
    passed: int = 0

    def finish(self, contract_id: str) -> None:
        """Raise the run's verdict: every collected failure; else, when no case passed, the first skip."""
        if self.failed:
            project = all(v.project for v in self.failed)
            message_only = all(v.message_only for v in self.failed)
            lines = [str(v).removeprefix(f"[{contract_id}] ") for v in self.failed]
            total = len(self.failed) + len(self.skipped) + self.passed
            head = f"{len(self.failed)} of {total} cases failed: " if total > 1 else ""
            skipped = f" ({len(self.skipped)} cases not judged: {'; '.join(str(s) for s in self.skipped)})" if self.skipped else ""
            raise ContractViolation(contract_id, head + " | ".join(lines) + skipped, project=project,
                                    message_only=message_only)
        if self.skipped and not self.passed:
            raise self.skipped[0]
        if self.skipped:
            note(f"partial: {self.passed} of {self.passed + len(self.skipped)} cases judged; not judged: "
                 + "; ".join(f"{s.verdict}: {s}" for s in self.skipped))


_CASES: ContextVar[CaseLog | None] = ContextVar("contract_cases", default=None)


@contextlib.contextmanager
def _collecting() -> Iterator[CaseLog]:
    log = CaseLog()
    token = _CASES.set(log)
    try:
        yield log
    finally:
        _CASES.reset(token)


@contextlib.contextmanager
def case(label: str) -> Iterator[None]:
    """One case of the running contract: a violation (or a skip verdict) inside is collected under ``label`` and
    the contract goes on; ``Contract.run`` fails with every collected violation at the end."""
    log = _CASES.get()
    if log is None:
        raise RuntimeError("case() used outside a contract check; run it through Contract.run")
    cid = current_contract_id()
    try:
        yield
    except ContractViolation as e:
        log.failed.append(ContractViolation(cid, str(e).removeprefix(f"[{cid}] "), e.project, e.message_only))
    except NotApplicable as e:
        log.skipped.append(type(e)(f"{label}: {e}"))
    except CommandLineRefused as e:
        judged = get_contract(cid).judge_refusal(e)
        if isinstance(judged, ContractViolation):
            log.failed.append(judged)
        else:
            log.skipped.append(judged)  # type: ignore[arg-type]
    else:
        log.passed += 1


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


def _docstring_rule(fn: Callable[[Any], None]) -> str:
    """A check's docstring as one line: the rule it states (lines joined by one space)."""
    text = " ".join(line.strip() for line in (fn.__doc__ or "").strip().splitlines())
    if not text:
        raise ValueError(f"contract {fn.__name__} states no rule: give it a docstring (or rule=...)")
    return text


def contract(
    id: str,
    source: str,
    rules: Iterable[str],
    needs: Iterable[str] = ("args",),
    note: str = "",
    stricter: str = "",
    options: Iterable[str] = (),
    rule: str | None = None,
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register ``check(subject)`` as a contract; the decorated name runs it through ``Contract.run``.
    The rule it checks is the check's docstring (``rule``: a text computed at import, e.g. an f-string).
    Inside, ``require(cond, message)`` or ``raise violation(message)`` fails it."""

    def deco(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if id in _REGISTRY:
            raise ValueError(f"duplicate contract id {id}")
        text = rule if rule is not None else _docstring_rule(fn)
        c = Contract(id, text, source, tuple(rules), frozenset(needs), fn, note, stricter, tuple(options))
        _REGISTRY[id] = c

        @functools.wraps(fn)
        def run(subject: Any) -> None:
            c.run(subject)

        run.contract_id = id  # type: ignore[attr-defined]
        return run

    return deco


def violation(message: str, project: bool = False, message_only: bool = False) -> ContractViolation:
    """A ContractViolation of the running contract (raise it); ``project``: of this project's stricter rule."""
    return ContractViolation(current_contract_id(), message, project, message_only)


def require(cond: Any, message: str, project: bool = False) -> None:
    """Fail the running contract with ``message`` unless ``cond``."""
    if not cond:
        raise violation(message, project)


def out_of_scope(option: str, reason: str) -> OutOfScope:
    """An OutOfScope for the running contract (raise it): the subject lacks ``option``, which the rule is about."""
    return OutOfScope(f"[{current_contract_id()}] {reason}", (option,))


def inconclusive(evidence: str) -> Inconclusive:
    """An Inconclusive for the running contract (raise it): what the run showed, and why it decides nothing."""
    return Inconclusive(f"[{current_contract_id()}] {evidence}")


def require_option(subject: Any, option: str) -> None:
    """The subject's command line has ``option`` (which the running contract's rule is about), else the contract
    is out of scope for it."""
    if option not in subject.cli_options():
        raise out_of_scope(option, f"the subject has no {option} option (its parser does not register it): the "
                                   "rule is about that option")


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
