"""Serving load generator (SGLang bench_serving's definitions): ``python bench/bench_serving.py --help``.

The same as ``python -m bench.serving``; see ``bench/serving/``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
