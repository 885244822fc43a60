"""``pytest spec --subject X --conformance-report FILE``: a Markdown conformance report of one engine.

A pytest plugin (loaded by the root ``conftest.py``). For every contract it records the verdict of its run
against the subject (``contracts.verdicts``: pass, a failure of a seed rule or of this project's stricter rule,
out of scope, not reached, inconclusive, harness error) with its evidence: a violation's message (what the engine
answered), a skip's reason, what a passing contract compared or could not check (``contracts.base.note``). The
other spec tests (properties, snapshots, mutants) are counted, and any harness error among them is listed.

The run is kept beside the report (``results_path``) with what makes it reproducible: the spec's commit
(``git describe --dirty``), the date, the CPU, the command and each server's launch command
(``--conformance-launch``, given by whoever started the servers). ``contracts.conformance_report`` writes the
report from it and the notes file (``--conformance-notes``: a ``## CONTRACT-ID`` heading per explained failure,
``## Overview`` for text above the table), and the index of every report (``docs/conformance/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from contracts import verdicts
from contracts.base import ContractViolation, get_contract, without_options
from contracts.verdicts import HARNESS_ERROR, Outcome

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption("--conformance-report", default=None, metavar="FILE",
                    help="write a Markdown conformance report of the subject (every contract's verdict and evidence)")
    group.addoption("--conformance-notes", default=None, metavar="FILE",
                    help="Markdown explanations of this engine's failures (## CONTRACT-ID sections, ## Overview)")
    group.addoption("--conformance-launch", action="append", default=[], metavar="COMMAND",
                    help="the exact command that started a server under test (repeat for each server)")


class Recorder:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.path: str = config.getoption("--conformance-report")
        self.contracts: dict[str, Outcome] = {}
        self.others: dict[str, Outcome] = {}
        self.subject_text = ""
        self.spec_version = spec_version()  # the checkout as the run starts (before any report is rewritten)

    # ---- collecting ----------------------------------------------------------------------
    def record(self, item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo) -> None:
        if "subject" not in getattr(item, "fixturenames", ()):
            return  # a test of the checkout itself (the catalogue, the reports), not of the subject
        if report.when == "call" or (report.when == "setup" and not report.passed):
            notes = [str(v) for k, v in report.user_properties if k == "contract_note"]
            outcome = _outcome(item, report, call, notes)
        elif report.when == "teardown" and report.failed:
            outcome = Outcome(HARNESS_ERROR, f"teardown: {_first_line(report.longreprtext)}")
        else:
            return
        cid = _contract_id(item)
        target = self.contracts if cid is not None else self.others
        key = cid if cid is not None else item.nodeid
        if key in target and target[key].verdict == HARNESS_ERROR:
            return  # keep the first harness error of an item
        target[key] = outcome

    # ---- writing ---------------------------------------------------------------------------
    def write(self) -> None:
        run = Run(self.subject_text, _command(self.config), cpu_model(), self.contracts, self.others,
                  self.spec_version, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  list(self.config.getoption("--conformance-launch")))
        results = results_path(self.path)
        os.makedirs(os.path.dirname(results), exist_ok=True)
        with open(results, "w") as f:
            json.dump(run.to_json(), f, indent=1)
        write_report(run, self.path, self.config.getoption("--conformance-notes"))
        write_index(os.path.dirname(os.path.abspath(self.path)))


@dataclass
class Run:
    """One suite run's verdicts, kept beside the report (``results_path``) so that notes can be added without
    rerunning the engine: ``python -m contracts.conformance RESULTS --report FILE --notes NOTES``."""

    subject_text: str
    command: str
    machine: str
    contracts: dict[str, Outcome]
    others: dict[str, Outcome]
    spec_version: str = "unknown"  # git describe --dirty of the checkout that ran
    date: str = "unknown"
    launches: list[str] = field(default_factory=list)  # each server's launch command

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject_text, "command": self.command, "machine": self.machine,
                "spec_version": self.spec_version, "date": self.date, "launches": self.launches,
                "contracts": {k: asdict(o) for k, o in self.contracts.items()},
                "others": {k: asdict(o) for k, o in self.others.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Run:
        return cls(d["subject"], d["command"], d["machine"],
                   {k: Outcome.from_json(o) for k, o in d["contracts"].items()},
                   {k: Outcome.from_json(o) for k, o in d["others"].items()},
                   d.get("spec_version", "unknown"), d.get("date", "unknown"), list(d.get("launches", [])))


def results_path(report: str) -> str:
    """Where a report's recorded verdicts are kept: .cache/conformance/<report name>.json (not committed)."""
    return os.path.join(".cache", "conformance", os.path.splitext(os.path.basename(report))[0] + ".json")


def _contract_id(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or not item.nodeid.split("::")[0].endswith("test_contracts.py"):
        return None
    c = callspec.params.get("contract")
    return getattr(c, "id", None)


def _outcome(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo, notes: list[str]) -> Outcome:
    if report.passed:
        return verdicts.from_pass(notes)
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return verdicts.from_skip(reason.removeprefix("Skipped: "))
    exc = call.excinfo
    cid = _contract_id(item)
    if exc is not None and exc.errisinstance(ContractViolation):
        return verdicts.from_failure(exc.value, get_contract(cid).project_only if cid else True)
    if exc is not None and exc.errisinstance(AssertionError):
        return verdicts.from_failure(exc.value, True)  # a spec test's own assertion (this project's tests)
    text = f"{exc.typename}: {exc.value}" if exc is not None else _first_line(report.longreprtext)
    return Outcome(HARNESS_ERROR, text)


def _first_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip()), "")


def _command(config: pytest.Config) -> str:
    return "pytest " + " ".join(without_options(config.invocation_params.args, "--conformance-"))


def cpu_model() -> str:
    """lscpu's model name, the core count and the widest vector ISA."""
    name = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except (OSError, subprocess.SubprocessError):
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores, {isa}"


def spec_version() -> str:
    """``git describe --always --dirty`` of the checkout the spec ran from."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


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


def write_report(run: Run, path: str, notes_path: str | None) -> None:
    from contracts.conformance_report import write_report as write

    write(run, path, notes_path)


def write_index(folder: str) -> None:
    from contracts.conformance_report import write_index as write

    write(folder)


def main(argv: list[str] | None = None) -> int:
    """Rewrite a report from its recorded verdicts with the current notes (no engine needed)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--report", required=True, help="the report to rewrite (its verdicts: .cache/conformance/)")
    ap.add_argument("--notes", default=None, help="the notes file (## CONTRACT-ID sections)")
    args = ap.parse_args(argv)
    with open(results_path(args.report)) as f:
        run = Run.from_json(json.load(f))
    write_report(run, args.report, args.notes)
    write_index(os.path.dirname(os.path.abspath(args.report)))
    print(f"wrote {args.report} from {results_path(args.report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
