"""Imports every mutant module so they register."""

import importlib
import pkgutil

import contracts.mutants as _pkg

for _m in pkgutil.iter_modules(_pkg.__path__):
    if _m.name.endswith("_mutants"):
        importlib.import_module(f"contracts.mutants.{_m.name}")
