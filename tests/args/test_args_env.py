"""impl.args.env: our own-prefix environment switches, parsed strictly."""

from __future__ import annotations

import pytest

from impl.args.env import ENV_PREFIX, envs

SWITCH = envs.YOCO_DISABLE_LAZY_COMPACTION


def test_name_has_our_prefix():
    assert SWITCH.name == "YOCO_DISABLE_LAZY_COMPACTION" and SWITCH.name.startswith(ENV_PREFIX)


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("YES", True), ("y", True), ("0", False), ("false", False), ("No", False), ("", False)])
def test_parses_booleans(monkeypatch, raw, value):
    monkeypatch.setenv(SWITCH.name, raw)
    assert SWITCH.get() is value


def test_unset_is_default(monkeypatch):
    monkeypatch.delenv(SWITCH.name, raising=False)
    assert SWITCH.get() is False and not SWITCH.is_set()


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(SWITCH.name, "maybe")
    with pytest.raises(ValueError, match=SWITCH.name):
        SWITCH.get()
