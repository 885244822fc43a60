"""Every relative link in README.md and docs/ resolves inside the repository; no document points outside it.

A clone of this repository has nothing beside it, so a link to ``../shared/...`` (or anything above the root)
is dead for every reader. Anchors into Markdown files must name a heading of the target (GitHub's slugs).
"""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers.markdown_links import Link, heading_anchors, links_in

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README_LIMIT_BYTES = 10 * 1024


def _documents() -> list[str]:
    docs = os.path.join(ROOT, "docs")
    found = [os.path.join(ROOT, "README.md")]
    for folder, _, files in os.walk(docs):
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return found


DOCUMENTS = _documents()


def _inside_repository(path: str) -> bool:
    return os.path.commonpath([ROOT, os.path.realpath(path)]) == ROOT


def _problem(doc: str, link: Link) -> str | None:
    if link.is_external:
        return None
    target = os.path.normpath(os.path.join(os.path.dirname(doc), link.path)) if link.path else doc
    if not _inside_repository(target):
        return "points outside the repository"
    if not os.path.exists(target):
        return "does not exist"
    if link.anchor and target.endswith(".md") and link.anchor not in heading_anchors(target):
        return f"no heading with anchor #{link.anchor}"
    return None


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: os.path.relpath(d, ROOT))
def test_relative_links_resolve_inside_the_repository(doc):
    bad = []
    for link in links_in(open(doc, encoding="utf-8").read()):
        problem = _problem(doc, link)
        if problem:
            bad.append(f"line {link.line}: {link.target}: {problem}")
    assert not bad, f"{os.path.relpath(doc, ROOT)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: os.path.relpath(d, ROOT))
def test_no_document_names_a_path_outside_the_repository(doc):
    text = open(doc, encoding="utf-8").read()
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if re.search(r"\.\./shared\b|(?<![\w./])shared/design/", line)]
    assert not lines, f"{os.path.relpath(doc, ROOT)} names ../shared (absent in a clone) on lines {lines}"


def test_readme_is_an_entrance():
    readme = os.path.join(ROOT, "README.md")
    assert os.path.getsize(readme) <= README_LIMIT_BYTES
    text = open(readme, encoding="utf-8").read()
    for must in ("--kv-sharing-fast-prefill", "make serve", "make test", "make test-fast", "--subject http://"):
        assert must in text, f"README.md lacks {must!r}"


def test_every_doc_is_on_the_readme_map():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    mapped = {os.path.normpath(link.path) for link in links_in(text) if not link.is_external and link.path}
    top_level = [os.path.relpath(d, ROOT) for d in DOCUMENTS if os.path.dirname(d) == os.path.join(ROOT, "docs")]
    missing = [d for d in top_level if d not in mapped]
    assert not missing, f"docs not linked from README.md's docs map: {missing}"
