"""The Markdown conformance report of one run (``contracts.conformance.Run``) and the index of every report.

A report an engine developer can act on without rerunning anything:

* the header says what produced it: the spec's commit (``git describe --dirty``), the date, the CPU, the
  command, and each server's launch command;
* one headline counts the verdicts (``contracts.verdicts``), e.g. "12 ran: 8 pass (3 partial), 2 fail on project
  rules, 2 inconclusive; 0 fail on seed rules; 48 out of scope, 28 not reached";
* a table row per contract that gave a verdict about the engine (pass, fail, inconclusive, harness error) with
  its rule (shortened; each id links to ``docs/contracts.md``), where the rule comes from, and the evidence (what
  was compared on a pass, what the engine did on a failure);
* the contracts that say nothing about the engine (out of scope, not reached) grouped by their real reason, with
  counts;
* below, every failure explained from the notes file, or marked unexplained.

``docs/conformance/README.md`` (``write_index``) is the headline of every report in the folder: the one place
other documents take the counts from (never typed by hand). ``spec/test_conformance_staleness.py`` fails when a
committed report's contract ids differ from the catalogue, or the index from the reports.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from contracts.base import Contract, all_contracts
from contracts.conformance import Run
from contracts.verdicts import (
    FAIL_PROJECT,
    FAIL_SEED,
    FAILS,
    HARNESS_ERROR,
    INCONCLUSIVE,
    MESSAGE_DIFFERS,
    NOT_REACHED,
    NOT_RUN,
    OUT_OF_SCOPE,
    PARTIAL,
    PASS,
    Outcome,
)

CATALOGUE = "../contracts.md"  # from docs/conformance/
INDEX = "README.md"
HEADLINE_MARK = "<!-- headline -->"
RULE_CHARS = 110


@dataclass(frozen=True)
class Counts:
    """The headline's figures for one run."""

    total: int
    by_verdict: dict[str, int]
    partial: int
    message_differs: int
    failures: int
    explained: int

    @property
    def ran(self) -> int:
        return sum(self.by_verdict.get(v, 0) for v in (PASS, FAIL_SEED, FAIL_PROJECT, INCONCLUSIVE))

    def headline(self) -> str:
        n = self.by_verdict.get
        parts = [f"{n(PASS, 0)} pass" + (f" ({self.partial} partial)" if self.partial else ""),
                 f"{n(FAIL_PROJECT, 0)} fail on project rules", f"{n(INCONCLUSIVE, 0)} inconclusive"]
        seed = f"{n(FAIL_SEED, 0)} fail on seed rules" + (
            f" ({self.message_differs} of them: {MESSAGE_DIFFERS})" if self.message_differs else "")
        rest = [f"{n(OUT_OF_SCOPE, 0)} out of scope", f"{n(NOT_REACHED, 0)} not reached",
                f"{n(HARNESS_ERROR, 0)} harness errors"] + ([f"{n(NOT_RUN)} not run"] if n(NOT_RUN) else [])
        return (f"{self.total} contracts, {self.ran} ran: {', '.join(parts)}; {seed}; {', '.join(rest)}; "
                f"{self.explained} of {self.failures} failures explained.")


def anchor(contract_id: str) -> str:
    """The id's anchor in docs/contracts.md (``contracts.docs`` writes one per row)."""
    return contract_id.lower()


def link(contract_id: str) -> str:
    return f"[`{contract_id}`]({CATALOGUE}#{anchor(contract_id)})"


def shorten(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip().replace("|", "\\|")
    return text if not limit or len(text) <= limit else text[: limit - 3].rstrip() + "..."


def counts(run: Run, contracts: list[Contract], notes: dict[str, str]) -> Counts:
    by: dict[str, int] = {}
    partial = message_differs = 0
    failures = []
    for c in contracts:
        o = outcome_of(run, c)
        by[o.verdict] = by.get(o.verdict, 0) + 1
        partial += o.verdict == PASS and o.detail == PARTIAL
        message_differs += o.verdict == FAIL_SEED and o.detail == MESSAGE_DIFFERS
        if o.verdict in (*FAILS, HARNESS_ERROR):
            failures.append(c.id)
    return Counts(len(contracts), by, partial, message_differs, len(failures), sum(f in notes for f in failures))


def outcome_of(run: Run, c: Contract) -> Outcome:
    return run.contracts.get(c.id, Outcome(NOT_RUN, "deselected (-k) or not collected"))


def _launch_line(launch: str) -> str:
    """A server's launch command; ``LABEL\tCOMMAND`` says which contracts or which run it served."""
    label, sep, cmd = launch.partition("\t")
    return f"- Server ({label}): `{cmd}`" if sep else f"- Server: `{launch}`"


def render(run: Run, notes: dict[str, str]) -> str:
    contracts = all_contracts()
    figures = counts(run, contracts, notes)
    lines = [
        f"# Conformance of {run.subject_text}",
        "",
        "Written by `pytest spec --conformance-report` (contracts/conformance_report.py); the explanations below the "
        "table come from the notes file. Regenerate, do not edit.",
        "",
        f"- Spec: `{run.spec_version}` (git describe --dirty), {run.date}",
        f"- Machine: {run.machine}",
        f"- Command: `{run.command}`",
        *[_launch_line(cmd) for cmd in run.launches],
        "",
        f"{HEADLINE_MARK}**{figures.headline()}**",
        "",
    ]
    if "Overview" in notes:
        lines += [notes["Overview"], ""]
    lines += _table(run, contracts)
    lines += _grouped(run, contracts)
    lines += _failures(run, contracts, notes)
    lines += _others(run, notes)
    return "\n".join(lines)


def _table(run: Run, contracts: list[Contract]) -> list[str]:
    rows = []
    for c in contracts:
        o = outcome_of(run, c)
        if o.verdict in (OUT_OF_SCOPE, NOT_REACHED):
            continue
        origin = c.origin + (f": {c.stricter}" if c.stricter else "")
        verdict = f"**{o.verdict}**" + (f" ({o.detail})" if o.detail else "")
        evidence = o.evidence if o.verdict != PASS else "; ".join(o.notes)
        rows.append(f"| {link(c.id)} | {shorten(c.rule, RULE_CHARS)} | {', '.join(c.rules)} | {shorten(origin, 0)} | "
                    f"{verdict} | {shorten(evidence, 500)} |")
    return [
        "Origin: `seed 000` / `seed 004` are the seeds' rules (F1-F16, K1-K47 of RULES.md); `project` marks this "
        "project's own rules (HTTP H*, engine E*, speculative S*, ...) or, after a seed, what the contract asks "
        "beyond the seed. Verdicts: contracts/verdicts.py.",
        "",
        "| contract | rule | rule ids | origin | verdict | evidence |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _grouped(run: Run, contracts: list[Contract]) -> list[str]:
    lines: list[str] = []
    for verdict, title in ((OUT_OF_SCOPE, "Out of scope: the engine lacks an option the rule is about"),
                           (NOT_REACHED, "Not reached by this kind of subject")):
        groups: dict[str, list[str]] = {}
        for c in contracts:
            o = outcome_of(run, c)
            if o.verdict == verdict:
                groups.setdefault(o.detail or o.evidence, []).append(c.id)
        if not groups:
            continue
        lines += [f"## {title} ({sum(len(v) for v in groups.values())})", ""]
        for reason, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"- {shorten(reason, 300)} ({len(ids)}): " + ", ".join(link(i) for i in ids))
        lines.append("")
    return lines


def _failures(run: Run, contracts: list[Contract], notes: dict[str, str]) -> list[str]:
    failed = [(c, outcome_of(run, c)) for c in contracts if outcome_of(run, c).verdict in (*FAILS, HARNESS_ERROR)]
    if not failed:
        return []
    lines = ["## Failures explained", ""]
    for c, o in failed:
        lines += [f"### `{c.id}` ({o.verdict}{', ' + o.detail if o.detail else ''})", ""]
        if len(shorten(o.evidence, 0)) > 500:  # the table cell was cut: the whole evidence here
            lines += ["```", o.evidence[:4000], "```", ""]
        lines += [notes.get(c.id, "**Not yet explained.**"), ""]
    return lines


def _others(run: Run, notes: dict[str, str]) -> list[str]:
    other: dict[str, int] = {}
    for o in run.others.values():
        other[o.verdict] = other.get(o.verdict, 0) + 1
    lines = ["Other spec tests (properties, snapshots, mutants): "
             + (", ".join(f"{n} {v}" for v, n in sorted(other.items())) or "none") + ".", ""]
    for verdicts, title in ((FAILS, "Other spec tests that failed"), ((HARNESS_ERROR,), "Harness errors outside the contracts")):
        listed = [(k, o) for k, o in run.others.items() if o.verdict in verdicts]
        if listed:
            lines += [f"## {title}", ""]
            lines += [f"- `{k}`: {shorten(o.evidence, 400)}" + (f" {notes[k]}" if k in notes else "") for k, o in listed]
            lines += [""]
    return lines


def read_notes(path: str | None) -> dict[str, str]:
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


def write_report(run: Run, path: str, notes_path: str | None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(render(run, read_notes(notes_path)))


def _unescape(cell: str) -> str:
    return cell.replace("\\|", "|")


def run_from_report(text: str, notes: dict[str, str] | None = None) -> Run:
    """A committed report read back into the run that rendered it (a report's recorded run, ``results_path``, stays
    on the machine that ran it): header, every contract's verdict, detail and evidence, the grouped reasons and
    the other tests' counts, so that ``render`` of it with the same notes gives the report again. Evidence the
    table cut (500 characters) comes from the failure's block below the table when the report kept it there; a
    pass's notes come back as one note (the table joins them with "; "). ``notes``: the notes file the report was
    rendered with (``read_notes``), whose text follows a listed other test's evidence."""
    from contracts.verdicts import VERDICTS

    notes = notes or {}
    listed: list[tuple[str, str, tuple[str, ...]]] = []  # other tests listed by key: (key, evidence, verdicts)
    lines = text.splitlines()
    subject = lines[0].removeprefix("# Conformance of ")
    head = {"spec": "unknown", "date": "unknown", "machine": "", "command": ""}
    launches: list[str] = []
    contracts: dict[str, Outcome] = {}
    others: dict[str, Outcome] = {}
    full_evidence: dict[str, str] = {}
    section = ""
    block_id: str | None = None
    block: list[str] | None = None
    for line in lines[1:]:
        m = re.match(r"^- Spec: `([^`]*)` \(git describe --dirty\), (.*)$", line)
        if m:
            head["spec"], head["date"] = m.group(1), m.group(2)
            continue
        m = re.match(r"^- (Machine|Command): (.*)$", line)
        if m and not section:
            head[m.group(1).lower()] = m.group(2).strip("`") if m.group(1) == "Command" else m.group(2)
            continue
        m = re.match(r"^- Server(?: \((.*)\))?: `(.*)`$", line)
        if m and not section:
            launches.append(f"{m.group(1)}\t{m.group(2)}" if m.group(1) else m.group(2))
            continue
        if line.startswith("## "):
            section = line
            continue
        m = re.match(r"^\| \[`([A-Z0-9-]+)`\]\([^)]*\) \| .* \| \*\*([^*]+)\*\*(?: \(([^|]*)\))? \| (.*) \|$", line)
        if m and not section:
            cid, verdict, detail, evidence = m.group(1), m.group(2), m.group(3) or "", _unescape(m.group(4))
            if verdict not in VERDICTS:
                raise ValueError(f"{cid}: unknown verdict {verdict!r}")
            contracts[cid] = (Outcome(verdict, notes=[evidence] if evidence else [], detail=detail) if verdict == PASS
                              else Outcome(verdict, evidence, detail=detail))
            continue
        m = re.match(r"^- (.*) \((\d+)\): (\[`.*)$", line)
        if m and section.startswith(("## Out of scope", "## Not reached")):
            verdict = OUT_OF_SCOPE if section.startswith("## Out of scope") else NOT_REACHED
            reason = _unescape(m.group(1))
            for cid in re.findall(r"\[`([A-Z0-9-]+)`\]", m.group(3)):
                contracts[cid] = Outcome(verdict, reason, detail=reason)
            continue
        m = re.match(r"^### `([A-Z0-9-]+)` ", line)
        if m and section == "## Failures explained":
            block_id, block = m.group(1), None
            continue
        if block_id is not None and line == "```":
            if block is None:
                block = []
            else:
                full_evidence[block_id] = "\n".join(block)
                block_id, block = None, None
            continue
        if block is not None:
            block.append(line)
            continue
        m = re.match(r"^- `([^`]+)`: (.*)$", line)
        if m and section in ("## Other spec tests that failed", "## Harness errors outside the contracts"):
            key, rest = m.group(1), m.group(2)
            if key in notes:
                rest = rest.removesuffix(" " + notes[key])
            listed.append((key, _unescape(rest), FAILS if section.startswith("## Other") else (HARNESS_ERROR,)))
            continue
        m = re.match(r"^Other spec tests \(properties, snapshots, mutants\): (.*)\.$", line)
        if m and m.group(1) != "none":
            for part in m.group(1).split(", "):
                n, verdict = part.split(" ", 1)
                for k in range(int(n)):
                    others[f"{verdict} {k}"] = Outcome(verdict)
    for cid, evidence in full_evidence.items():
        contracts[cid].evidence = evidence
    placeholders = list(others)
    for key, evidence, verdicts in listed:  # a counted placeholder of the same verdict becomes the listed test
        slot = next(k for k in placeholders if others[k].verdict in verdicts)
        placeholders.remove(slot)
        others[key] = Outcome(others.pop(slot).verdict, evidence)
    return Run(subject, head["command"], head["machine"], contracts, others, head["spec"], head["date"], launches)


def report_ids(text: str) -> set[str]:
    """The contract ids a report lists (every contract appears once, as a link to the catalogue)."""
    return set(re.findall(r"\[`([A-Z0-9][A-Z0-9-]*)`\]\(" + re.escape(CATALOGUE) + "#", text))


def reports(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".md") and f != INDEX)


def render_index(folder: str) -> str:
    lines = ["# Conformance reports", "",
             "Generated from the reports in this folder (`python -m contracts.conformance_report --index`, and by "
             "every report run); `spec/test_conformance_staleness.py` fails when it is stale. Quote these counts from "
             "here, never by hand.", "",
             "| report | subject | spec | headline |", "|---|---|---|---|"]
    for name in reports(folder):
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        title = next((ln[2:].removeprefix("Conformance of ") for ln in text.splitlines() if ln.startswith("# ")), name)
        spec = re.search(r"^- Spec: `([^`]*)`[^,\n]*,? ?(.*)$", text, re.M)
        head = next((ln.removeprefix(HEADLINE_MARK).strip("*") for ln in text.splitlines()
                     if ln.startswith(HEADLINE_MARK)), "(no headline: a report from before the verdict taxonomy)")
        when = f"`{spec.group(1)}`, {spec.group(2)}" if spec else "unknown"
        lines.append(f"| [{name}]({name}) | {shorten(title, 160)} | {when} | {head} |")
    return "\n".join(lines) + "\n"


def write_index(folder: str) -> None:
    with open(os.path.join(folder, INDEX), "w") as f:
        f.write(render_index(folder))


if __name__ == "__main__":
    import sys

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "conformance")
    if "--index" in sys.argv:
        write_index(folder)
        print(f"wrote {os.path.join(folder, INDEX)}")
    if "--rebuild" in sys.argv:  # --rebuild NAME: the recorded run of docs/conformance/NAME.md, read back from it
        import json

        from contracts.conformance import results_path

        name = sys.argv[sys.argv.index("--rebuild") + 1].removesuffix(".md")
        report = os.path.join(folder, name + ".md")
        notes = read_notes(os.path.join(folder, "notes", name + ".md"))
        text = open(report, encoding="utf-8").read()
        run = run_from_report(text, notes)
        again = render(run, notes)
        rows = [ln for ln in text.splitlines() if ln.startswith("| [`")]
        # the same report again, or (contracts added since) every row it had, unchanged
        if again != text and (report_ids(text) == {c.id for c in all_contracts()} or not set(rows) <= set(again.splitlines())):
            sys.exit(f"{report}: the run read back does not render the report's rows again (regenerate it instead)")
        os.makedirs(os.path.dirname(results_path(report)), exist_ok=True)
        with open(results_path(report), "w") as f:
            json.dump(run.to_json(), f, indent=1)
        print(f"wrote {results_path(report)} from {report}")
