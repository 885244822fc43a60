"""impl.envs: every environment variable declared once and parsed strictly (junk is a ValueError naming it)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import impl.envs
from impl.envs import declared, envs

SWITCH = envs.YOCO_DISABLE_LAZY_COMPACTION
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("y", True), ("on", True),
                                       ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_parses_booleans(monkeypatch, raw, value):
    monkeypatch.setenv(SWITCH.name, raw)
    assert SWITCH.get() is value


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv(SWITCH.name, raising=False)
    assert SWITCH.get() is False and not SWITCH.is_set()
    monkeypatch.setenv(envs.IMPL_CPU_FUSED.name, " ")
    assert envs.IMPL_CPU_FUSED.get() is True  # default on: empty keeps it on, as before


@pytest.mark.parametrize("var,raw,accepted", [
    (envs.IMPL_CPU_FUSED, "garbage", "a boolean (1 true yes y on or 0 false no n off)"),
    (envs.YOCO_DISABLE_LAZY_COMPACTION, "maybe", "a boolean"),
    (envs.IMPL_CPU_LINEAR, "fastest", "one of auto, packed, onednn, mkl"),
    (envs.IMPL_TRITON_KERNELS, "cuda", "one of auto, triton, cpu, interpreter, reference"),
    (envs.YOCO_DP_READY_TIMEOUT, "soon", "a finite number of seconds above 0"),
    (envs.YOCO_SERVER_START_TIMEOUT, "-5", "a finite number of seconds above 0"),
    (envs.IMPL_CPU_MARCH, "native -O0", "a gcc -march name"),
    (envs.TRITON_INTERPRET, "yes", "a boolean as Triton reads it (1 true on or 0 false off)"),
])
def test_junk_names_the_variable_the_value_and_the_choices(monkeypatch, var, raw, accepted):
    monkeypatch.setenv(var.name, raw)
    with pytest.raises(ValueError) as e:
        var.get()
    msg = str(e.value)
    assert f"{var.name}={raw!r}" in msg and accepted in msg and "unset it for the default" in msg, msg


def test_typed_values(monkeypatch):
    monkeypatch.setenv(envs.IMPL_CPU_LINEAR.name, " MKL ")
    assert envs.IMPL_CPU_LINEAR.get() == "mkl"
    monkeypatch.setenv(envs.YOCO_DP_READY_TIMEOUT.name, "2.5")
    assert envs.YOCO_DP_READY_TIMEOUT.get() == 2.5
    monkeypatch.setenv(envs.IMPL_CPU_MARCH.name, "haswell")
    assert envs.IMPL_CPU_MARCH.get() == "haswell"
    monkeypatch.delenv(envs.YOCO_CACHE_DIR.name, raising=False)
    assert envs.YOCO_CACHE_DIR.get() is None


def test_every_variable_is_documented_and_its_default_parses():
    doc = impl.envs.__doc__ or ""
    for name, var in declared().items():
        assert re.search(rf"\b{name}\b", doc), f"{name} is not documented in impl/envs.py's docstring"
        if isinstance(var.default, str) and var.default:
            assert var.parse(var.default) == var.default, name


def _environ_reads(tree: ast.AST, names: set[str]) -> list[str]:
    """``os.environ.get("X")``, ``os.getenv("X")``, ``os.environ["X"]`` (read) and ``"X" in os.environ`` for our
    variables: the declared ones and any IMPL_* / YOCO_* name. Writes (``os.environ["X"] = ``) are fine."""
    def ours(arg: ast.AST) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value in names or arg.value.startswith(("IMPL_", "YOCO_")):
                return arg.value
        return None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            if f.attr == "getenv" or (f.attr == "get" and ast.unparse(f.value) == "os.environ"):
                key = ours(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ":
            key = ours(node.slice)
        elif isinstance(node, ast.Compare) and any(ast.unparse(c) == "os.environ" for c in node.comparators):
            key = ours(node.left)
        if key is not None:
            found.append(f"{node.lineno} ({key})")
    return found


def test_impl_reads_its_variables_only_through_envs():
    """One parser: no module of impl but impl/envs.py reads one of our variables itself (impl/kernels/triton_env.py
    peeks at IMPL_TRITON_KERNELS by its declared name before torch loads triton; a typo is refused later)."""
    names = set(declared())
    found = []
    for path in sorted((ROOT / "impl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != "impl/envs.py":
            found += [f"{rel}:{n}" for n in _environ_reads(ast.parse(path.read_text()), names)]
    assert not found, f"read these through impl.envs: {found}"
    planted = ast.parse('import os\nos.environ.get("IMPL_CPU_FUSED", "1")\nos.environ["YOCO_CACHE_DIR"]\n')
    assert len(_environ_reads(planted, names)) == 2  # the check itself sees a read
