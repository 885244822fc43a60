"""bench/docs_section.py: a benchmark's --write-docs replaces its own section of docs/benchmarks.md, found by the
whole heading line, and appends it only when that heading is absent."""

from __future__ import annotations

import pytest

from bench.docs_section import replace_section

DOC = """# Benchmarks

## YOCO fast prefill at E2B dimensions, 7 layers, flag off on torch_native

off body

## YOCO fast prefill at E2B dimensions, 7 layers

old body
### a subsection of it

## Serving benchmark

serving body
"""


def test_replaces_the_section_with_exactly_that_heading(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)
    replace_section("## YOCO fast prefill at E2B dimensions, 7 layers\n\nnew body\n", str(path))
    doc = path.read_text()
    assert "old body" not in doc and "a subsection of it" not in doc
    assert "off body" in doc and "serving body" in doc  # the heading it begins is another section
    assert doc.count("## YOCO fast prefill at E2B dimensions, 7 layers\n") == 1
    assert doc.index("new body") < doc.index("## Serving benchmark")


def test_a_missing_section_is_appended_and_the_last_one_replaced(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)
    replace_section("## KV memory\n\nkv body", str(path))
    replace_section("## KV memory\n\nkv body 2", str(path))
    doc = path.read_text()
    assert doc.endswith("## KV memory\n\nkv body 2\n") and doc.count("## KV memory") == 1


def test_text_without_its_heading_is_refused(tmp_path):
    with pytest.raises(ValueError, match="heading"):
        replace_section("no heading\n", str(tmp_path / "benchmarks.md"))
