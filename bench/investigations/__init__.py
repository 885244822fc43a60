"""Scripts written for one investigation (no Makefile target runs them); docs/history/benchmarks.md cites them."""
