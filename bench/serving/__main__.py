import sys

from bench.serving.cli import main

sys.exit(main())
