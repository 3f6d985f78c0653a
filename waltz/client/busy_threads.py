"""What each thread of a pool runs, and since when: so that a wait for one of its threads can say
what holds them (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["BusyThreads"]


class BusyThreads:
    """The work each thread of a pool is running, with its start (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str | Callable[[], str], float]] = {}
        self._reported_at: float | None = None

    @contextlib.contextmanager
    def running(self, what: str | Callable[[], str]) -> Iterator[None]:
        """Record that the calling thread runs ``what`` (a name for messages, or a function that
        makes it when it is asked for) until the block ends; a block inside another of the same
        thread counts as the outer one's work."""
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
        return _named(self._since())

    def held(self, seconds: float, every: float) -> list[tuple[str, float]]:
        """What the busy threads run (as :meth:`longest`) when one of them has run a single work
        for ``seconds`` or more, to be reported; else, or when this answered so less than
        ``every`` seconds ago, an empty list. Names are made only to be reported."""
        since = self._since()
        if not since or since[0][1] < seconds:
            return []
        now = time.monotonic()
        with self._lock:
            if self._reported_at is not None and now - self._reported_at < every:
                return []
            self._reported_at = now
        return _named(since)

    def _since(self) -> list[tuple[str | Callable[[], str], float]]:
        now = time.monotonic()
        with self._lock:
            running = list(self._running.values())
        return sorted(((what, now - since) for what, since in running), key=lambda item: -item[1])


def _named(since: list[tuple[str | Callable[[], str], float]]) -> list[tuple[str, float]]:
    return [(what if isinstance(what, str) else what(), seconds) for what, seconds in since]
