"""What each thread of a pool runs, and since when: so that a wait for one of its threads can say
what holds them (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["BusyThreads"]


class BusyThreads:
    """The work each thread of a pool is running, with its start (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float]] = {}

    @contextlib.contextmanager
    def running(self, what: str) -> Iterator[None]:
        """Record that the calling thread runs ``what`` (a name for messages) until the block
        ends; a block inside another of the same thread counts as the outer one's work."""
        ident = threading.get_ident()
        with self._lock:
            outer = self._running.get(ident)
            if outer is None:
                self._running[ident] = (what, time.monotonic())
        try:
            yield
        finally:
            if outer is None:
                with self._lock:
                    self._running.pop(ident, None)

    def longest(self) -> list[tuple[str, float]]:
        """What the busy threads run, with seconds since it started, the longest first."""
        now = time.monotonic()
        with self._lock:
            running = list(self._running.values())
        return sorted(((what, now - since) for what, since in running), key=lambda item: -item[1])
