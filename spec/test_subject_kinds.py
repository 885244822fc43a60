"""Against every kind of subject (``impl``, a server at a URL, ``sglang``, ``vllm``) every spec test runs or is skipped naming
the capability the subject lacks: no spec test can end in an AttributeError of the harness.

Three facts make it so, each checked here without starting anything:

* every attribute the contracts and spec tests read from a subject is a capability method (``CAPABILITY_OF``),
  which ``CapabilityGuard`` turns into a ``MissingCapability`` skip where the subject lacks it, or one of the few
  attributes every subject has;
* each kind of subject defines every method of each capability it claims;
* every spec test that uses the subject declares what it needs (``@pytest.mark.needs``; the contract tests use
  each contract's ``needs``), and a contract run against a subject of each kind reaches the subject only through
  capabilities it has (a probe subject answers every call of a capability it has with a sentinel).
"""

from __future__ import annotations

import ast
import os

import pytest

from contracts.adapters.http_adapter import HttpSubject
from contracts.adapters.impl_adapter import ImplSubject
from contracts.adapters.sglang_adapter import SglangSubject
from contracts.adapters.vllm_adapter import VllmSubject
from contracts.base import CAPABILITIES, all_contracts
from contracts.subject import CAPABILITY_OF, SUBJECT_KINDS, CapabilityGuard, MissingCapability

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Attributes every subject kind has (or that are read with a default: env_prefix, describe).
COMMON = {"name", "capabilities", "describe", "env_prefix", "inner"}
KINDS = {
    "impl": (ImplSubject, ImplSubject.capabilities),
    "url": (HttpSubject, HttpSubject("http://127.0.0.1:9").capabilities),
    "url+fast-prefill": (HttpSubject, HttpSubject("http://127.0.0.1:9", "http://127.0.0.1:10").capabilities),
    "sglang": (SglangSubject, SglangSubject.capabilities),
    "vllm": (VllmSubject, VllmSubject.capabilities),
}


def _subject_attributes() -> dict[str, set[str]]:
    """file -> attributes read as ``subject.<attr>`` in contracts/ and spec/."""
    out: dict[str, set[str]] = {}
    for folder in ("contracts", "spec"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "adapters" in dirpath or "mutants" in dirpath or "__pycache__" in dirpath:
                continue
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                tree = ast.parse(open(path).read(), path)
                attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "subject"}
                if attrs:
                    out[os.path.relpath(path, ROOT)] = attrs
    return out


def test_spec_reads_subjects_only_through_capabilities():
    bad = {f: sorted(a - set(CAPABILITY_OF) - COMMON) for f, a in _subject_attributes().items()}
    bad = {f: a for f, a in bad.items() if a}
    assert not bad, f"subject attributes outside CAPABILITY_OF (add them there, with their capability): {bad}"


def test_capability_table_names_known_capabilities():
    assert set(CAPABILITY_OF.values()) <= CAPABILITIES


def test_subject_kinds_table_matches_the_adapters():
    """``SUBJECT_KINDS`` (which the 'not reached' verdicts quote) says what each adapter has."""
    named = {"impl": "impl", "url": "http://URL", "url+fast-prefill": "http://URL + --subject-fast-prefill",
             "sglang": "sglang", "vllm": "vllm"}
    for kind, (_, caps) in KINDS.items():
        assert SUBJECT_KINDS[named[kind]] == caps, kind


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_implements_what_it_claims(kind):
    cls, caps = KINDS[kind]
    assert caps <= CAPABILITIES, caps
    missing = [m for m, cap in CAPABILITY_OF.items() if cap in caps and not callable(getattr(cls, m, None))]
    assert not missing, f"{cls.__name__} claims {sorted(caps)} but lacks {missing}"


class _Reached(Exception):
    """The probe's answer to any capability call: the contract got as far as the subject."""


class _Probe:
    """A subject of one kind's capabilities that answers every capability call with ``_Reached``."""

    def __init__(self, kind: str, capabilities: frozenset[str]):
        self.name, self.capabilities = f"probe({kind})", capabilities

    def __getattr__(self, name):
        if name in CAPABILITY_OF:
            def call(*a, **kw):
                raise _Reached(name)
            return call
        raise AttributeError(name)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_contract_runs_or_names_the_missing_capability(kind):
    caps = KINDS[kind][1]
    subject = CapabilityGuard(_Probe(kind, caps))
    ran = 0
    for c in all_contracts():
        if not c.needs <= caps:
            continue  # spec/test_contracts.py skips it, naming c.needs - caps
        try:
            c.run(subject)
        except _Reached:
            ran += 1
        except MissingCapability as e:
            assert e.capability not in caps, f"{c.id} on {kind}: {e}"
        else:
            raise AssertionError(f"{c.id} on {kind} finished without asking the subject anything")
    assert ran or kind == "url+fast-prefill" or not caps & {"args", "http", "engine"}, kind


def _declares_needs(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "needs":
            return True
    return False


def test_spec_tests_using_the_subject_declare_their_needs():
    undeclared = []
    for f in sorted(os.listdir(os.path.join(ROOT, "spec"))):
        if not f.startswith("test_") or f in ("test_contracts.py", "test_subject_kinds.py"):
            continue  # test_contracts skips on each contract's own needs
        tree = ast.parse(open(os.path.join(ROOT, "spec", f)).read())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_") and "subject" in {a.arg for a in fn.args.args}:
                if not _declares_needs(fn):
                    undeclared.append(f"{f}::{fn.name}")
    assert not undeclared, f"spec tests using the subject without @pytest.mark.needs(...): {undeclared}"
