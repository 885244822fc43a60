"""The ``--conformance-report`` writer (``contracts.conformance``, ``contracts.conformance_report``): the verdict
taxonomy's headline, explanations from the notes file, the whole evidence of a long failure, skips grouped by
their reason, a report rewritten from its recorded verdicts without the engine."""

from __future__ import annotations

import json

from contracts.base import all_contracts
from contracts.conformance import Run, main, results_path, write_report
from contracts.conformance_report import INDEX, report_ids
from contracts.verdicts import (
    FAIL_PROJECT,
    FAIL_SEED,
    INCONCLUSIVE,
    MESSAGE_DIFFERS,
    NOT_REACHED,
    OUT_OF_SCOPE,
    PARTIAL,
    PASS,
    Outcome,
    from_skip,
)

LONG = "3 of 18 bad requests were not refused:\n  " + "\n  ".join(f"POST /v1/x case {i}: " + "y" * 60 for i in range(12))


def _run() -> Run:
    ids = [c.id for c in all_contracts()]
    contracts = {
        ids[0]: Outcome(PASS, notes=["what it compared"]),
        ids[1]: Outcome(FAIL_SEED, LONG),
        ids[2]: Outcome(FAIL_PROJECT, "short evidence"),
        ids[3]: from_skip("not reached: subject x lacks capabilities ['args']; reached by --subject impl or sglang"),
        ids[4]: from_skip("out of scope: [X] the subject has no --kv-sharing-fast-prefill option"),
        ids[5]: from_skip("out of scope: [Y] the subject has no --kv-sharing-fast-prefill, which this rule is about"),
        ids[6]: Outcome(INCONCLUSIVE, "pairs on both sides of the threshold"),
        ids[7]: Outcome(FAIL_SEED, "decision conforms, message differs: ...", detail=MESSAGE_DIFFERS),
        ids[8]: Outcome(PASS, notes=["partial: 2 of 3 cases judged"], detail=PARTIAL),
    }
    return Run("demo engine", "pytest spec --subject demo", "some CPU", contracts,
               {"spec/test_x.py::t": Outcome("harness error", "AttributeError: boom")},
               "abc1234-dirty", "2026-12-03 11:00 UTC", ["demo serve --port 1"])


def test_headline_taxonomy_explanations_and_groups(tmp_path):
    run, ids = _run(), [c.id for c in all_contracts()]
    notes = tmp_path / "notes.md"
    notes.write_text(f"## Overview\n\nTwo servers.\n\n## `{ids[1]}`\n\nThe engine does Z instead.\n")
    report = tmp_path / "r.md"
    write_report(run, str(report), str(notes))
    text = report.read_text()
    not_run = len(ids) - 9
    assert (f"**{len(ids)} contracts, 6 ran: 2 pass (1 partial), 1 fail on project rules, 1 inconclusive; "
            f"2 fail on seed rules (1 of them: {MESSAGE_DIFFERS}); 2 out of scope, 1 not reached, 0 harness errors, "
            f"{not_run} not run; 1 of 3 failures explained.**") in text
    assert "Two servers." in text and "The engine does Z instead." in text and "**Not yet explained.**" in text
    assert "POST /v1/x case 11" in text  # cut in the table, whole below it
    assert "what it compared" in text and "AttributeError: boom" in text
    assert "- Spec: `abc1234-dirty`" in text and "- Server: `demo serve --port 1`" in text
    assert "- no --kv-sharing-fast-prefill (2): " in text  # grouped by reason, with the count
    assert "- needs args (reached by impl or sglang) (1): " in text
    assert report_ids(text) == {c.id for c in all_contracts()}  # every contract once, linked to the catalogue
    assert f"](../contracts.md#{ids[0].lower()})" in text


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
    assert "explained later" in text and "1 of 3 failures explained" in text and "# Conformance of demo engine" in text
    assert "demo engine" in (tmp_path / "docs" / INDEX).read_text()


def test_verdicts_read_back_from_skips():
    assert from_skip("out of scope: [F] the subject has no --x, --y, which this rule is about").detail == "no --x"
    assert from_skip("inconclusive: [F] noise").verdict == INCONCLUSIVE
    nr = from_skip("not reached: subject s lacks the 'engine' capability (generate); reached by --subject impl")
    assert (nr.verdict, nr.detail) == (NOT_REACHED, "needs engine (reached by impl)")
    assert from_skip("out of scope: [F] other words").verdict == OUT_OF_SCOPE


def test_a_report_reads_back_into_the_run_that_renders_it(tmp_path):
    """``run_from_report`` (a recorded run rebuilt from a committed report, so one contract's verdict can be
    merged without rerunning the rest): rendered again with the same notes, the run gives the report byte for byte,
    a long failure's whole evidence included; a harness error outside the contracts keeps its test's id."""
    from contracts.conformance_report import read_notes, render, run_from_report

    ids = [c.id for c in all_contracts()]
    notes_path = tmp_path / "notes.md"
    notes_path.write_text(f"## Overview\n\nTwo servers.\n\n## `{ids[1]}`\n\nThe engine does Z | not W.\n")
    notes = read_notes(str(notes_path))
    run = _run()
    run.launches.append("prefix caching on: X\tdemo serve --port 2 --prefix")
    text = render(run, notes)
    back = run_from_report(text, notes)
    assert render(back, notes) == text
    assert back.contracts[ids[1]].evidence == LONG  # from the block below the table
    assert list(back.others) == ["spec/test_x.py::t"] and back.launches == run.launches
    assert (back.spec_version, back.date, back.machine) == (run.spec_version, run.date, run.machine)
