"""YOCO tests: the model-level ones use tests/helpers/model.py's helpers and fixtures."""

from __future__ import annotations

from tests.helpers.model import _one_intra_op_thread, shared_config_name  # noqa: F401  (fixtures: register for this folder)
