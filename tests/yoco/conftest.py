"""YOCO tests: the model-level ones use tests/model's helpers (model_helpers, harness) and fixtures."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model"))

from model_helpers import _one_intra_op_thread, shared_config_name  # noqa: E402,F401  (fixtures: register for this folder)
