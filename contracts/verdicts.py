"""The verdicts a conformance report gives, and how a pytest outcome becomes one.

* ``pass``: the subject kept the rule (``partial`` when some of its cases were out of scope or inconclusive);
* ``fail: seed rule``: it broke a seed's rule (``decision conforms, message differs`` when it made the seed's
  decision, a refusal of the right type, but its message lacks the seed's words);
* ``fail: project rule``: it broke this project's stricter rule (a contract whose rule ids are all this project's,
  or a case the contract marks ``project``);
* ``out of scope``: the subject lacks an option the rule is about (which one);
* ``not reached``: this kind of subject lacks a capability the rule needs (which one, and which kinds reach it);
* ``inconclusive``: the run decides nothing (noise, a refusal of an option the rule is not about), with evidence;
* ``harness error``: a defect of the specification or its adapter, never a verdict about the engine;
* ``not run``: deselected or not collected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL_SEED, FAIL_PROJECT = "pass", "fail: seed rule", "fail: project rule"
OUT_OF_SCOPE, NOT_REACHED, INCONCLUSIVE = "out of scope", "not reached", "inconclusive"
HARNESS_ERROR, NOT_RUN = "harness error", "not run"
VERDICTS = (PASS, FAIL_SEED, FAIL_PROJECT, INCONCLUSIVE, OUT_OF_SCOPE, NOT_REACHED, HARNESS_ERROR, NOT_RUN)
FAILS = (FAIL_SEED, FAIL_PROJECT)
SKIPS = (OUT_OF_SCOPE, NOT_REACHED, INCONCLUSIVE)  # the verdicts a pytest skip carries (spec/conftest.py)
MESSAGE_DIFFERS = "decision conforms, message differs"
PARTIAL = "partial"


@dataclass
class Outcome:
    verdict: str
    evidence: str = ""
    notes: list[str] = field(default_factory=list)
    detail: str = ""  # MESSAGE_DIFFERS, PARTIAL, the option out of scope, the capability not reached

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Outcome:
        verdict = {"fail": FAIL_SEED, "not applicable": NOT_REACHED}.get(d["verdict"], d["verdict"])  # first reports
        return cls(verdict, d.get("evidence", ""), list(d.get("notes", [])), d.get("detail", ""))


def from_skip(reason: str) -> Outcome:
    """A pytest skip's reason (``verdict: message``, spec/conftest.py) as an outcome, its detail read back."""
    verdict = next((v for v in SKIPS if reason.startswith(v + ": ")), NOT_REACHED)
    text = reason.removeprefix(verdict + ": ")
    return Outcome(verdict, text, detail=skip_detail(verdict, text))


def skip_detail(verdict: str, text: str) -> str:
    """What a grouped row of the report is keyed on: the options lacking, or the capabilities and the kinds
    that reach them."""
    if verdict == OUT_OF_SCOPE:
        m = re.search(r"has no (--[\w-]+)", text)  # grouped by the first option it lacks
        return f"no {m.group(1)}" if m else "an option the rule is about"
    if verdict == NOT_REACHED:
        m = re.search(r"lacks (?:capabilities \[([^\]]*)\]|the '(\w+)' capability)", text)
        caps = (m.group(1) or m.group(2)).replace("'", "") if m else "a capability"
        kinds = re.search(r"reached by --subject (.*)$", text)
        return f"needs {caps}" + (f" (reached by {kinds.group(1)})" if kinds else "")
    return ""


def from_failure(exc: BaseException | None, project_only: bool) -> Outcome:
    """A contract's failure: of a seed rule unless the violation or the contract says it is this project's."""
    project = project_only or bool(getattr(exc, "project", False))
    detail = ""
    if getattr(exc, "message_only", False) and not project:
        detail = MESSAGE_DIFFERS
    elif not project:  # some of its failing cases made the seed's decision with another message
        cases = re.match(r"\[[^\]]*\] (\d+) of \d+ cases failed", str(exc))
        k = str(exc).count(MESSAGE_DIFFERS)
        if cases and k:
            detail = f"{k} of {cases.group(1)} failing cases: {MESSAGE_DIFFERS}"
    return Outcome(FAIL_PROJECT if project else FAIL_SEED, str(exc), detail=detail)


def from_pass(notes: list[str]) -> Outcome:
    return Outcome(PASS, notes=notes, detail=PARTIAL if any(n.startswith("partial:") for n in notes) else "")
