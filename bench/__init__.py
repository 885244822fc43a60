"""Benchmarks (not tests), run from the repository root as modules: ``python -m bench.<script>``, which puts the
root on ``sys.path`` (the Makefile's ``bench-*`` targets do). Results go to docs/benchmarks.md; sections a script
writes with ``--write-docs`` go through ``bench/docs_section.py``. ``bench/investigations/`` holds scripts written
for one investigation, cited by docs/history/benchmarks.md."""
