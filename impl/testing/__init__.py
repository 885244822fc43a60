"""Test-only helpers (the oracle drafter): nothing that serves imports them (``tests/test_import_graph.py``)."""
