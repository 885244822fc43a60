"""The ``--conformance-report`` writer (``contracts.conformance``): headline counts, explanations from the notes
file, the whole evidence of a long failure, and a report rewritten from its recorded verdicts without the engine."""

from __future__ import annotations

import json

from contracts.base import all_contracts
from contracts.conformance import Outcome, Run, main, results_path, write_report

LONG = "3 of 18 bad requests were not refused:\n  " + "\n  ".join(f"POST /v1/x case {i}: " + "y" * 60 for i in range(12))


def _run() -> Run:
    ids = [c.id for c in all_contracts()]
    contracts = {ids[0]: Outcome("pass", notes=["what it could not check"]), ids[1]: Outcome("fail", LONG),
                 ids[2]: Outcome("fail", "short evidence"), ids[3]: Outcome("not applicable", "lacks ['args']")}
    return Run("demo engine", "pytest spec --subject demo", "some CPU", contracts,
               {"spec/test_x.py::t": Outcome("harness error", "AttributeError: boom")})


def test_counts_explanations_and_long_evidence(tmp_path):
    run, ids = _run(), [c.id for c in all_contracts()]
    notes = tmp_path / "notes.md"
    notes.write_text(f"## Overview\n\nTwo servers.\n\n## `{ids[1]}`\n\nThe engine does Z instead.\n")
    report = tmp_path / "r.md"
    write_report(run, str(report), str(notes))
    text = report.read_text()
    not_run = len(ids) - 4
    assert (f"**{len(ids)} contracts: 1 pass, 2 fail, 1 not applicable, 1 harness errors, {not_run} not run; "
            "1 of 2 failures explained.**") in text
    assert "Two servers." in text and "The engine does Z instead." in text and "**Not yet explained.**" in text
    assert "POST /v1/x case 11" in text  # cut in the table, whole below it
    assert "what it could not check" in text and "AttributeError: boom" in text


def test_report_rewritten_from_recorded_verdicts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = "docs/r.md"
    path = tmp_path / results_path(report)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_run().to_json()))
    assert Run.from_json(json.loads(path.read_text())) == _run()
    notes = tmp_path / "n.md"
    notes.write_text(f"## {all_contracts()[2].id}\n\nexplained later\n")
    assert main(["--report", report, "--notes", str(notes)]) == 0
    text = (tmp_path / report).read_text()
    assert "explained later" in text and "1 of 2 failures explained" in text and "# Conformance of demo engine" in text
