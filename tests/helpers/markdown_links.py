"""Links and heading anchors of a Markdown document, as GitHub renders them (enough for this repository's docs)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Link:
    target: str
    line: int

    @property
    def is_external(self) -> bool:
        return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", self.target))

    @property
    def path(self) -> str:
        return self.target.split("#", 1)[0]

    @property
    def anchor(self) -> str:
        return self.target.split("#", 1)[1] if "#" in self.target else ""


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def links_in(text: str) -> list[Link]:
    """Every inline link and image target outside code."""
    return [Link(m.group(1), number) for number, line in _prose_lines(text) for m in _INLINE_LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets kept as their text, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def heading_anchors(path: str) -> frozenset[str]:
    """Every anchor the headings of a Markdown file define (a repeated heading gets -1, -2, ...), and every HTML
    anchor (``<a id="...">``, as the generated catalogue gives each contract id)."""
    seen: dict[str, int] = {}
    anchors = set(re.findall(r'<a id="([^"]+)"', open(path, encoding="utf-8").read()))
    fenced = False
    for line in open(path, encoding="utf-8").read().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return frozenset(anchors)
