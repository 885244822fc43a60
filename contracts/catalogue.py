"""Imports every contract module so they register (any ``contracts/*.py`` defining contracts)."""

import importlib
import pkgutil

import contracts as _pkg

_SKIP = {"base", "subject", "models", "expect", "logcapture", "catalogue", "docs"}

for _m in pkgutil.iter_modules(_pkg.__path__):
    if not _m.ispkg and _m.name not in _SKIP:
        importlib.import_module(f"contracts.{_m.name}")
