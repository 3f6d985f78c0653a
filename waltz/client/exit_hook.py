"""Clients still open when the interpreter exits are closed first, with a word: a client the
application forgot to close would otherwise go on receiving from its servers while Python's
thread pools refuse work, and drop the transactions it still had in flight without a word. The
hook gives those :data:`EXIT_WAIT` seconds to end, then closes the client
(docs/design/client.md "WaltzClient and AsyncWaltzClient").
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["EXIT_WAIT", "close_at_exit"]

#: Seconds an unclosed client's transactions in flight are given to end at exit.
EXIT_WAIT = 10.0

log = logging.getLogger(__name__)


class _Closable(Protocol):
    """What the hook needs of a client's core."""

    @property
    def closed(self) -> bool: ...

    def in_flight_at_exit(self, wait: float) -> tuple[str, int, int]: ...

    def close(self, timeout: float = ...) -> None: ...


#: The open clients' cores -> the process that made them (a forked child exits without them).
_open: weakref.WeakKeyDictionary[_Closable, int] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_registered = False


def close_at_exit(core: _Closable) -> None:
    """Close ``core`` when the interpreter exits if it is still open then: before Python joins
    its threads and its thread pools stop taking work (``concurrent.futures`` stops at that point
    too, and this hook, registered after it, runs before it)."""
    global _registered
    with _lock:
        _open[core] = os.getpid()
        if not _registered:
            # The hook concurrent.futures stops its pools with (CPython's, since 3.9): ours, made
            # later, runs first. atexit's would run only after the threads were joined.
            register: Callable[[Callable[[], None]], object] = getattr(
                threading, "_register_atexit", atexit.register
            )
            register(_close_open_clients)
            _registered = True


def _close_open_clients() -> None:
    with _lock:
        cores = [core for core, pid in _open.items() if pid == os.getpid()]
    for core in cores:
        if core.closed:
            continue
        name, in_flight, left = core.in_flight_at_exit(EXIT_WAIT)
        if left:
            log.warning(
                "%s was not closed when the interpreter began to exit: %d of its %d transaction(s) "
                "in flight had not ended %gs later; closing it now, they end with ClientClosedError "
                "(their appends may or may not have been committed). Close a client once its "
                "submissions have ended (await them, or flush()): async with AsyncWaltzClient(...), "
                "with WaltzClient(...)",
                name,
                left,
                in_flight,
                EXIT_WAIT,
            )
        elif in_flight:
            log.warning(
                "%s was not closed when the interpreter began to exit: waited for its %d "
                "transaction(s) in flight to end, and closing it now. Close a client once its "
                "submissions have ended (await them, or flush()): async with AsyncWaltzClient(...), "
                "with WaltzClient(...)",
                name,
                in_flight,
            )
        else:
            log.info("%s was not closed when the interpreter began to exit: closing it now", name)
        try:
            core.close()
        except Exception:
            log.exception("closing %s at exit failed", name)
