"""The lock between the scheduler loop and control calls (flush, integrity check, abort on a loopless engine).

CPython's ``threading.Lock`` hands nothing over on release: the scheduler loop releases it after a step and
takes it back at once for the next, so a control call from another thread could wait for the whole
generation (``/flush_cache`` with no timeout answered 200 after a 480-token request instead of a 400 during
it). Here a control call announces itself; the loop, between steps, lets every announced caller through
before it takes the lock again, so a control call waits for one step at most.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

YIELD_POLL_S = 0.0002  # the loop's wait while a control call holds the lock (it runs for microseconds to ms)


class StepLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._waiting = 0  # control callers announced and not yet done

    @contextlib.contextmanager
    def control(self) -> Iterator[None]:
        """Hold the lock for a control call; the loop yields to it between steps."""
        with self._count_lock:
            self._waiting += 1
        try:
            with self._lock:
                yield
        finally:
            with self._count_lock:
                self._waiting -= 1

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Hold the lock for one scheduler step, after every announced control call has had its turn."""
        while self._waiting:
            time.sleep(YIELD_POLL_S)
        with self._lock:
            yield
