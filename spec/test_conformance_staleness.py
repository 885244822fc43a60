"""The committed conformance reports (``docs/conformance/``) cannot go stale silently: each lists exactly the
catalogue's contracts (a contract added, renamed or removed since a report was written fails this until the report
is regenerated), and the folder's index (``README.md``, the headline of every report, the one place other documents
quote counts from) is the one ``contracts.conformance_report`` generates from them. Fast: no subject is started."""

from __future__ import annotations

import os

from contracts.base import all_contracts
from contracts.conformance_report import INDEX, render_index, report_ids, reports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "docs", "conformance")


def test_committed_reports_list_the_catalogue():
    """Every committed report lists exactly the catalogue's contracts: a contract added, renamed or removed
    since the report was written makes it stale, and this fails until it is regenerated."""
    catalogue = {c.id for c in all_contracts()}
    stale = {}
    for name in reports(FOLDER):
        ids = report_ids(open(os.path.join(FOLDER, name), encoding="utf-8").read())
        if ids != catalogue:
            stale[name] = {"missing": sorted(catalogue - ids), "unknown": sorted(ids - catalogue)}
    assert not stale, f"stale conformance reports (regenerate them: make conformance-sglang / conformance-vllm): {stale}"


def test_index_is_generated_from_the_reports():
    with open(os.path.join(FOLDER, INDEX), encoding="utf-8") as f:
        assert f.read() == render_index(FOLDER), "docs/conformance/README.md is stale: python -m contracts.conformance_report --index"
