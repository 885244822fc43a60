"""The sections of docs/benchmarks.md that benchmark scripts write (``--write-docs``).

A section is a level-2 heading line and everything up to the next level-2 heading. A script's text starts with
its heading; ``replace_section`` puts it where the section with exactly that heading line is (a heading that
only begins the same way, "## YOCO fast prefill" vs "## YOCO fast prefill at E2B dimensions", is another
section), or appends it at the end when there is none. The file is re-read right before writing: others edit it
too. The headings the scripts write are their ``SECTION`` constants and the Makefile's ``--section`` arguments.
"""

from __future__ import annotations

import os
import re

BENCHMARKS_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")


def replace_section(text: str, path: str = BENCHMARKS_MD) -> None:
    """Write ``text`` (its first line a ``## `` heading) as that heading's section of ``path``."""
    heading = text.split("\n", 1)[0].rstrip()
    if not heading.startswith("## "):
        raise ValueError(f"a section starts with its '## ' heading line, not {heading!r}")
    doc = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            doc = f.read()
    if not doc.strip():
        doc = "# Benchmarks\n"
    body = text.rstrip("\n") + "\n"
    m = re.search(rf"^{re.escape(heading)}[ \t]*$", doc, re.M)
    if m is None:
        doc = doc.rstrip("\n") + "\n\n" + body
    else:
        nxt = re.compile(r"^## ", re.M).search(doc, m.end())
        doc = doc[: m.start()] + body + ("\n" + doc[nxt.start():] if nxt else "")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, path)


def print_section(text: str, write: bool, path: str = BENCHMARKS_MD) -> None:
    """Print a script's section; with ``write`` (its ``--write-docs``) also put it into ``path``."""
    print(text)
    if write:
        replace_section(text, path)
