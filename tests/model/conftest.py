"""Model tests: the fixtures of tests/helpers/model.py (the configs, one intra-op thread) register here."""

from __future__ import annotations

from tests.helpers.model import _one_intra_op_thread, config_name, shared_config_name  # noqa: F401  (fixtures)
