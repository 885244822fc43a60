"""No import circles in impl and contracts, read statically from the import statements (under a second).

A circle among module-level imports makes ``python -c "import impl.X"`` fail for
some X, depending on which module is imported first. A circle through imports
inside functions imports fine but ties layers that should not know each other
(``launch_server`` -> the data-parallel front -> a replica -> ``launch_server``
was one): the server's modules may not have one at all.

How an import statement becomes edges (Python's rules): ``import a.b.c`` loads
``a``, ``a.b`` and ``a.b.c``; ``from a.b import n`` loads ``a.b`` and, when
``a.b.n`` is a module, that module (then ``a.b``'s own names are not needed).
A module's own parent packages are always mid-import while it runs, so edges
to them count only when a name is taken from them. Imports under
``if TYPE_CHECKING:`` count as module-level ones: they never run, but a
circle through them is still two modules that each need the other's names
(``SchedulerConfig`` once tied the scheduler and its decode-worker seam so).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("impl", "contracts")
# Modules (prefixes) whose imports, inside functions too, may not form any circle.
SERVER = ("impl.launch_server", "impl.launch_cluster", "impl.server")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, mods: dict) -> set[str]:
    own = set(_ancestors(module))
    if isinstance(node, ast.Import):
        loads = set()
        for alias in node.names:
            loads |= {*_ancestors(alias.name), alias.name}
        return {t for t in loads if t in mods and t not in own}
    base = node.module or ""
    if node.level:  # relative: from the current package, up level - 1
        pkg = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    out = {t for t in _ancestors(base) if t not in own}
    subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods}
    if len(subs) < len(node.names) or base not in own:
        out.add(base)  # a name defined in ``base`` itself
    return {t for t in out | subs if t in mods and t != module}


def import_graph(with_function_imports: bool) -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        is_pkg = path.name == "__init__.py"

        def visit(body: list, module_level: bool) -> None:
            for node in body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    if module_level or with_function_imports:
                        edges.update(_targets(node, name, is_pkg, mods))
                    continue
                inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list) and sub and isinstance(sub[0], ast.AST):
                        visit(sub, inner)

        visit(ast.parse(path.read_text()).body, True)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_circle_among_module_level_imports():
    assert circles(import_graph(with_function_imports=False)) == []


def test_the_server_modules_form_no_circle_even_through_function_imports():
    found = [c for c in circles(import_graph(with_function_imports=True)) if any(m.startswith(SERVER) for m in c)]
    assert found == [], f"import circles through the server's modules: {found}"


def test_the_graph_sees_a_circle():
    """The reader is not blind: a made-up pair that imports each other is a circle."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = import_graph(with_function_imports=True)
    assert "impl.server.runtime" in graph["impl.server.dp_replica"]
    assert "impl.server.dp_replica" in graph["impl.server.dp_control"]


def test_the_graph_reads_type_checking_imports():
    """An import only the type checker runs is an edge too (a circle through one is still a circle)."""
    graph = import_graph(with_function_imports=False)
    assert "impl.engine.speculative.base" in graph["impl.engine.scheduler"]


def test_the_server_takes_its_default_model_from_a_public_module():
    """The production server's modules reach the checkpoint factory only through ``impl.models_builtin``, the one
    public module that names the embedded default model, and nothing that serves imports the test helpers
    (``impl.testing``)."""
    graph = import_graph(with_function_imports=True)
    bad = sorted(f"{m} -> {t}" for m, edges in graph.items() if m.startswith(SERVER) or m == "impl.engine.engine"
                 for t in edges if t.startswith(("impl.testing", "impl.checkpoint_factory")))
    bad += sorted(f"impl.checkpoint_factory -> {t}" for m, edges in graph.items()
                  if m.startswith("impl.checkpoint_factory") for t in edges if t.startswith("impl.testing"))
    assert bad == []
    assert "impl.models_builtin" in graph["impl.server.runtime"]


def test_contracts_import_no_unpackaged_module():
    """An installed ``contracts`` (pyproject packages impl* and contracts*) runs by URL: no module of it imports
    ``bench``, ``tests`` or ``spec``, which are not packaged."""
    bad = []
    for name, path in _modules().items():
        if not name.startswith("contracts"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{name}: {n}" for n in names if n.split(".")[0] in ("bench", "tests", "spec")]
    assert bad == []
