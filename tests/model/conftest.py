"""Model tests: make this folder's helper modules importable (model_helpers, harness)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from model_helpers import *  # noqa: E402,F401,F403  (fixtures defined there register here)
