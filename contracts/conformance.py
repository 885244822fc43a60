"""``pytest spec --subject X --conformance-report FILE``: a Markdown conformance report of one engine.

A pytest plugin (loaded by the root ``conftest.py``). For every contract it records the verdict of its run
against the subject:

* ``pass``; ``fail`` (a ``ContractViolation``: the evidence is the violation's message, what the engine
  answered); ``not applicable`` (the subject cannot show the rule: a capability, route or counter it lacks;
  the evidence is the reason); ``harness error`` (anything else: a defect of the specification or its
  adapter, never a verdict about the engine);
* the rule ids and where the rule comes from: a seed (``seed 000``, ``seed 004``) or this project's own rules
  (``project``), and for seed rules what this project asks beyond the seed (``Contract.stricter``);
* what a passing contract could not check (``contracts.base.note``).

Below the table every failure is explained from ``--conformance-notes FILE`` (Markdown; a ``## CONTRACT-ID``
heading per explained contract, ``## Overview`` for text printed above the table): a real deviation of that
engine (what it does instead), or a contract that asked for more than the rule (then the contract is fixed).
A failure without an explanation is marked as such and counted in the headline. The other spec tests
(properties, snapshots, mutants) are counted, and any harness error among them is listed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from contracts.base import ContractViolation, all_contracts

VERDICTS = ("pass", "fail", "not applicable", "harness error")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption("--conformance-report", default=None, metavar="FILE",
                    help="write a Markdown conformance report of the subject (every contract's verdict and evidence)")
    group.addoption("--conformance-notes", default=None, metavar="FILE",
                    help="Markdown explanations of this engine's failures (## CONTRACT-ID sections, ## Overview)")


@dataclass
class Outcome:
    verdict: str
    evidence: str = ""
    notes: list[str] = field(default_factory=list)


class Recorder:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.path: str = config.getoption("--conformance-report")
        self.contracts: dict[str, Outcome] = {}
        self.others: dict[str, Outcome] = {}
        self.subject_text = ""

    # ---- collecting ----------------------------------------------------------------------
    def record(self, item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = _outcome(report, call)
        elif report.when == "teardown" and report.failed:
            outcome = Outcome("harness error", f"teardown: {_first_line(report.longreprtext)}")
        else:
            return
        outcome.notes = [v for k, v in report.user_properties if k == "contract_note"]
        cid = _contract_id(item)
        target = self.contracts if cid is not None else self.others
        key = cid if cid is not None else item.nodeid
        if key in target and target[key].verdict == "harness error":
            return  # keep the first harness error of an item
        target[key] = outcome

    # ---- writing ---------------------------------------------------------------------------
    def write(self) -> None:
        run = Run(self.subject_text, _command(self.config), _cpu(), self.contracts, self.others)
        results = results_path(self.path)
        os.makedirs(os.path.dirname(results), exist_ok=True)
        with open(results, "w") as f:
            json.dump(run.to_json(), f, indent=1)
        write_report(run, self.path, self.config.getoption("--conformance-notes"))


@dataclass
class Run:
    """One suite run's verdicts, kept beside the report (``results_path``) so that notes can be added without
    rerunning the engine: ``python -m contracts.conformance RESULTS --report FILE --notes NOTES``."""

    subject_text: str
    command: str
    machine: str
    contracts: dict[str, Outcome]
    others: dict[str, Outcome]

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject_text, "command": self.command, "machine": self.machine,
                "contracts": {k: asdict(o) for k, o in self.contracts.items()},
                "others": {k: asdict(o) for k, o in self.others.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Run:
        return cls(d["subject"], d["command"], d["machine"], {k: Outcome(**o) for k, o in d["contracts"].items()},
                   {k: Outcome(**o) for k, o in d["others"].items()})


def results_path(report: str) -> str:
    """Where a report's recorded verdicts are kept: .cache/conformance/<report name>.json (not committed)."""
    return os.path.join(".cache", "conformance", os.path.splitext(os.path.basename(report))[0] + ".json")


def write_report(run: Run, path: str, notes_path: str | None) -> None:
    notes = _read_notes(notes_path)
    contracts = all_contracts()
    counts = {v: 0 for v in VERDICTS}
    rows, failures = [], []
    for c in contracts:
        o = run.contracts.get(c.id, Outcome("not run", "deselected (-k) or not collected"))
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
        origin = c.origin + (f": {c.stricter}" if c.stricter else "")
        evidence = o.evidence if o.verdict != "pass" else "; ".join(o.notes)
        rows.append(f"| `{c.id}` | {', '.join(c.rules)} | {_cell(origin)} | **{o.verdict}** | {_cell(evidence, 500)} |")
        if o.verdict in ("fail", "harness error"):
            failures.append((c, o))
    unexplained = [c.id for c, _ in failures if c.id not in notes]
    other_counts: dict[str, int] = {}
    for o in run.others.values():
        other_counts[o.verdict] = other_counts.get(o.verdict, 0) + 1
    harness_errors = counts["harness error"] + other_counts.get("harness error", 0)
    lines = [
        f"# Conformance of {run.subject_text}",
        "",
        "Written by `pytest spec --conformance-report` (contracts/conformance.py); the explanations below the "
        "table come from the notes file. Regenerate, do not edit.",
        "",
        f"Command: `{run.command}`  ",
        f"Machine: {run.machine}",
        "",
        f"**{len(contracts)} contracts: {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['not applicable']} not applicable, {harness_errors} harness errors"
        + (f", {counts['not run']} not run" if counts.get("not run") else "")
        + f"; {len(failures) - len(unexplained)} of {len(failures)} failures explained.**"
        + f" Other spec tests: {_counts(other_counts)}.",
        "",
    ]
    if "Overview" in notes:
        lines += [notes["Overview"], ""]
    lines += [
        "Origin: `seed 000` / `seed 004` are the seeds' rules (F1-F16, K1-K47 of RULES.md); `project` marks this "
        "project's own rules (HTTP H*, engine E*, speculative S*, ...) or, after a seed, what the contract asks "
        "beyond the seed.",
        "",
        "| contract | rule ids | origin | verdict | evidence |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    if failures:
        lines += ["## Failures explained", ""]
        for c, o in failures:
            lines += [f"### `{c.id}` ({o.verdict})", ""]
            if len(_cell(o.evidence)) > 500:  # the table cell was cut: the whole evidence here
                lines += ["```", o.evidence[:4000], "```", ""]
            lines += [notes.get(c.id, "**Not yet explained.**"), ""]
    for verdict, title in (("fail", "Other spec tests that failed"), ("harness error", "Harness errors outside the contracts")):
        listed = [(k, o) for k, o in run.others.items() if o.verdict == verdict]
        if listed:
            lines += [f"## {title}", ""]
            lines += [f"- `{k}`: {_cell(o.evidence, 400)}" + (f" {notes[k]}" if k in notes else "") for k, o in listed]
            lines += [""]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _contract_id(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or not item.nodeid.split("::")[0].endswith("test_contracts.py"):
        return None
    c = callspec.params.get("contract")
    return getattr(c, "id", None)


def _outcome(report: pytest.TestReport, call: pytest.CallInfo) -> Outcome:
    if report.passed:
        return Outcome("pass")
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return Outcome("not applicable", reason.removeprefix("Skipped: "))
    exc = call.excinfo
    if exc is not None and exc.errisinstance((ContractViolation, AssertionError)):
        return Outcome("fail", str(exc.value))  # a violation, or a spec test's own assertion about the answers
    text = f"{exc.typename}: {exc.value}" if exc is not None else _first_line(report.longreprtext)
    return Outcome("harness error", text)


def _first_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip()), "")


def _cell(text: str, limit: int = 0) -> str:
    text = re.sub(r"\s+", " ", text).strip().replace("|", "\\|")
    return text if not limit or len(text) <= limit else text[: limit - 3] + "..."


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "none"


def _command(config: pytest.Config) -> str:
    args, skip = [], False
    for a in config.invocation_params.args:
        if skip:
            skip = False
        elif a.startswith("--conformance-"):
            skip = "=" not in a
        else:
            args.append(a)
    return "pytest " + " ".join(args)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
        isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
        return f"{name}, {os.cpu_count()} cores, {isa}"
    except OSError:
        return platform.machine()


def _read_notes(path: str | None) -> dict[str, str]:
    """``## heading`` -> the text under it (contract ids without backticks, or Overview)."""
    if not path or not os.path.isfile(path):
        return {}
    out: dict[str, str] = {}
    key = None
    for line in open(path, encoding="utf-8").read().splitlines():
        m = re.match(r"^## +`?([^`]+?)`?\s*$", line)
        if m:
            key = m.group(1)
            out[key] = ""
        elif key is not None:
            out[key] += line + "\n"
    return {k: v.strip() for k, v in out.items()}


_RECORDER = pytest.StashKey[Recorder]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--conformance-report"):
        config.stash[_RECORDER] = Recorder(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    rec = item.config.stash.get(_RECORDER, None)
    if rec is not None:
        rec.record(item, report, call)
        funcargs = getattr(item, "funcargs", {})
        if not rec.subject_text and "subject" in funcargs:
            subject = funcargs["subject"]
            try:
                rec.subject_text = getattr(subject, "describe", lambda: subject.name)()
            except Exception as e:  # noqa: BLE001 - the report still names the subject
                rec.subject_text = f"{subject.name} (its description failed: {type(e).__name__}: {e})"
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    rec = session.config.stash.get(_RECORDER, None)
    if rec is not None:
        if not rec.subject_text:
            rec.subject_text = str(session.config.getoption("--subject"))
        rec.write()


def main(argv: list[str] | None = None) -> int:
    """Rewrite a report from its recorded verdicts with the current notes (no engine needed)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--report", required=True, help="the report to rewrite (its verdicts: .cache/conformance/)")
    ap.add_argument("--notes", default=None, help="the notes file (## CONTRACT-ID sections)")
    args = ap.parse_args(argv)
    with open(results_path(args.report)) as f:
        run = Run.from_json(json.load(f))
    write_report(run, args.report, args.notes)
    print(f"wrote {args.report} from {results_path(args.report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
