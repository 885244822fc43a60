"""Capture log records of a logger tree as (levelname, message) pairs."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))


@contextlib.contextmanager
def capture_logs(logger_name: str, level: int = logging.DEBUG) -> Iterator[list[tuple[str, str]]]:
    """(levelname, message) of every record of ``logger_name``'s tree at ``level`` or above, while inside."""
    logger = logging.getLogger(logger_name)
    handler = _ListHandler()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@contextlib.contextmanager
def patched_env(env: dict[str, str] | None) -> Iterator[None]:
    import os

    if not env:
        yield
        return
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
