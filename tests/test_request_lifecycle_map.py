"""docs/request_lifecycle.md names the code as it is: every ``path:function`` / ``path:Class.method`` it gives
exists (the file parses and defines it), every bare ``Class.attr`` names a class attribute or method in ``impl/``,
every path exists, and every thread name of its table is one the code gives a thread. Static (ast), no imports."""

from __future__ import annotations

import ast
import functools
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "request_lifecycle.md")

REF = re.compile(r"((?:impl|contracts|bench|tests|spec|docs)/[\w./-]*)(?::([\w.]+))?")
BARE = re.compile(r"([A-Z]\w*)\.(\w+)")


@functools.lru_cache(maxsize=None)
def parsed(path: str) -> ast.Module:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _defined(stmts: list[ast.stmt], name: str) -> ast.AST | None:
    """The def, class or assignment of ``name`` among ``stmts`` (looking into if / try / with blocks, not defs)."""
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and s.name == name:
            return s
        if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets):
            return s
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == name:
            return s
        for block in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(s, (ast.If, ast.Try, ast.With)) and block in s._fields:
                inner = [x for h in getattr(s, block) for x in (h.body if isinstance(h, ast.ExceptHandler) else [h])]
                found = _defined(inner, name)
                if found is not None:
                    return found
    return None


def _instance_attr(cls: ast.ClassDef, name: str) -> bool:
    """``self.<name> = ...`` in one of the class's methods."""
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr == name:
                return True
    return False


@functools.lru_cache(maxsize=None)
def impl_classes() -> dict[str, list[ast.ClassDef]]:
    """Every class defined in impl/, by name."""
    out: dict[str, list[ast.ClassDef]] = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "impl")):
        for fn in files:
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn), ROOT)
                for node in ast.walk(parsed(rel)):
                    if isinstance(node, ast.ClassDef):
                        out.setdefault(node.name, []).append(node)
    return out


def _member(cls: ast.ClassDef, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """``name`` is a method, nested class, class attribute or instance attribute of ``cls`` or of a base class
    defined in impl/."""
    if _defined(cls.body, name) is not None or _instance_attr(cls, name):
        return True
    for base in cls.bases:
        bname = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if bname and bname not in seen:
            if any(_member(b, name, seen | {bname}) for b in impl_classes().get(bname, [])):
                return True
    return False


def resolve(path: str, qualname: str) -> str | None:
    """None when ``path`` defines ``qualname`` (dotted: a class's methods and attributes, a function's nested
    functions), else what is missing."""
    if not os.path.isfile(os.path.join(ROOT, path)):
        return f"{path} does not exist"
    scope: list[ast.stmt] = parsed(path).body
    node: ast.AST | None = None
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        found = _defined(scope, part)
        if found is None and isinstance(node, ast.ClassDef) and i == len(parts) - 1 and _member(node, part):
            return None
        if found is None:
            return f"{path} defines no {'.'.join(parts[: i + 1])}"
        node = found
        scope = getattr(found, "body", [])
    return None


def problems(text: str) -> list[str]:
    """What the document names that the code lacks, one line each (``line N: ...``)."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for tok in re.findall(r"`([^`]+)`", line):
            m = REF.fullmatch(tok)
            if m:
                path, qual = m.group(1).rstrip("/"), m.group(2)
                if qual is None:
                    if not os.path.exists(os.path.join(ROOT, path)):
                        out.append(f"line {lineno}: `{tok}`: no such path")
                else:
                    why = resolve(path, qual)
                    if why is not None:
                        out.append(f"line {lineno}: `{tok}`: {why}")
                continue
            b = BARE.fullmatch(tok)
            if b:
                classes = impl_classes().get(b.group(1), [])
                if not classes:
                    out.append(f"line {lineno}: `{tok}`: no class {b.group(1)} in impl/")
                elif not any(_member(c, b.group(2)) for c in classes):
                    out.append(f"line {lineno}: `{tok}`: {b.group(1)} has no {b.group(2)}")
    return out


def thread_names(text: str) -> list[str]:
    """The names in the second column of the document's thread table."""
    section = text.split("## Threads", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|") for r in section.splitlines() if r.startswith("| ") and not r.startswith("| thread")]
    return [n for r in rows for n in re.findall(r"`([\w-]+)`", r[2])]


def doc_text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def test_every_name_the_map_gives_exists():
    text = doc_text()
    refs = [t for t in re.findall(r"`([^`]+)`", text) if (m := REF.fullmatch(t)) and m.group(2)]
    assert len(refs) >= 60, f"the map names only {len(refs)} path:function hops; is it still written that way?"
    bad = problems(text)
    assert not bad, "docs/request_lifecycle.md names code that does not exist (update the page):\n" + "\n".join(bad)


def test_every_thread_of_the_table_is_named_in_the_code():
    names = thread_names(doc_text())
    assert {"engine-scheduler", "engine-detokenizer", "http-intake"} <= set(names), names
    sources = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "impl")):
        sources += [open(os.path.join(dirpath, f), encoding="utf-8").read() for f in files if f.endswith(".py")]
    missing = [n for n in names if not any(f'"{n}"' in s for s in sources)]
    assert not missing, f"thread names in docs/request_lifecycle.md that no thread in impl/ has: {missing}"


@pytest.mark.parametrize("stale", [
    "`impl/engine/engine.py:Engine.make_req`",  # a method that does not exist
    "`impl/engine/scheduler.py:Scheduler.validate`",
    "`impl/server/streaming.py:stable_text`",  # a function that does not exist
    "`impl/server/app.py:_add_routes.no_such_route`",  # a nested function that does not exist
    "`impl/engine/no_such_module.py:f`",  # a file that does not exist
    "`impl/no_such_dir`",
    "`Scheduler.validate`",  # a bare Class.attr
])
def test_a_stale_name_is_reported(stale):
    assert problems(f"text {stale} text") != []


def test_existing_names_of_each_kind_pass():
    assert problems("`impl/engine/engine.py:Engine.submit` `impl/server/app.py:_add_routes.generate` "
                    "`impl/server/intake.py:_POOL` `impl/engine/request_handle.py:RequestHandle.queue` "
                    "`impl/engine/scheduler.py:Scheduler.inbox` `SWARadixCache.all_slots` `Engine.scheduler_torch_threads` "
                    "`impl/model` `impl/forward_batch.py`") == []
