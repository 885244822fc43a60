"""The ``http`` subject: any running server at a base URL (``pytest spec --subject http://127.0.0.1:30000``).

It cannot launch servers, so ``base_url`` ignores ``argv``: every contract talks
to the one server. Contracts that compare launches (fast prefill on vs off)
notice that both URLs are the same and check what one server can show.
"""

from __future__ import annotations

from typing import Sequence


class HttpSubject:
    capabilities = frozenset({"http"})

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.name = f"http({self.url})"

    def base_url(self, argv: Sequence[str]) -> str:
        return self.url
