"""The genesis hold: a new child's genesis waits for its parent's applied mark to reach ``B(p)``.

Source: docs/design/splits.md "Clients across a split" (the client holds a child's genesis,
before absorbing or applying it, until the parent's applied mark reaches ``B(p)``; the hold is a
pause of that partition's apply, not a failure), "Why no update is lost" (a client passes a
child's lock check only once it applied the genesis, so its state holds every write of the
parent up to the barrier). The child's apply worker calls :meth:`GenesisHold.wait` on its own
thread before it absorbs or applies the genesis. The parent's mark is this client's applied mark
of the parent when it mounts the parent, else the callbacks' ``get_client_high_water_mark`` of the
parent (another instance sharing the database applies it), read again with a backoff bounded by
:data:`MAX_HOLD_POLL`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from waltz.client.routing import SplitOrigin
from waltz.client.waiting import Watermark

__all__ = ["MAX_HOLD_POLL", "GenesisHold"]

log = logging.getLogger(__name__)

#: Longest pause between two reads of the parent's mark while a genesis is held, in seconds.
MAX_HOLD_POLL = 1.0
#: The first pause, doubled at each read up to :data:`MAX_HOLD_POLL`.
FIRST_HOLD_POLL = 0.02


class GenesisHold:
    """The hold of one new child's genesis (docs/design/splits.md "Clients across a split").

    Args:
        origin: the child, its parent and the parent's barrier ``B(p)``.
        own_parent_mark: this client's applied mark of the parent when it mounts the parent, else
            None (asked at each read: the parent may be mounted or unmounted meanwhile).
        callbacks_mark: the callbacks' ``get_client_high_water_mark``.
    """

    def __init__(
        self,
        origin: SplitOrigin,
        own_parent_mark: Callable[[int], Watermark | None],
        callbacks_mark: Callable[[int], int],
    ) -> None:
        self.origin = origin
        self._own = own_parent_mark
        self._callbacks_mark = callbacks_mark
        self.holding = False
        """True while the genesis waits (read from any thread)."""
        self.last_parent_mark = -1
        """The parent's mark at the last read."""

    @property
    def genesis(self) -> int:
        """The genesis's transaction ID, ``B(p) + 1``."""
        return self.origin.genesis

    def parent_mark(self) -> int:
        """The parent's applied mark now: this client's when it mounts the parent, else the
        callbacks' (an exception there is logged and reads as -1: the hold goes on)."""
        own = self._own(self.origin.parent)
        if own is not None:
            return own.value
        try:
            return self._callbacks_mark(self.origin.parent)
        except Exception as exc:
            log.warning(
                "partition %d: reading partition %d's mark for its genesis raised %r; trying again",
                self.origin.child,
                self.origin.parent,
                exc,
            )
            return -1

    def wait(self, closed: threading.Event) -> bool:
        """Block until the parent's mark reaches ``B(p)`` (on the child's apply thread).

        A hold that starts and one that ends are logged; nothing is reported as a failure.

        Args:
            closed: set when the worker stops.

        Returns:
            True once the genesis may be applied; False when ``closed`` was set first.
        """
        origin = self.origin
        pause = FIRST_HOLD_POLL
        started: float | None = None
        while not closed.is_set():
            mark = self.last_parent_mark = self.parent_mark()
            if mark >= origin.barrier:
                if started is not None:
                    self.holding = False
                    log.info(
                        "partition %d: its genesis at %d goes on after %.2fs: partition %d is applied "
                        "up to %d (its barrier %d)",
                        origin.child,
                        origin.genesis,
                        time.monotonic() - started,
                        origin.parent,
                        mark,
                        origin.barrier,
                    )
                return True
            if started is None:
                started = time.monotonic()
                self.holding = True
                log.info(
                    "partition %d: holding its genesis at %d until partition %d is applied up to its "
                    "barrier %d (applied up to %d now); the partition's apply pauses "
                    '(docs/design/splits.md, "Clients across a split")',
                    origin.child,
                    origin.genesis,
                    origin.parent,
                    origin.barrier,
                    mark,
                )
            own = self._own(origin.parent)
            if own is not None:
                own.wait(origin.barrier, pause)  # wakes at once when this client applies it
                if closed.is_set():
                    break
            elif closed.wait(pause):
                break
            pause = min(MAX_HOLD_POLL, pause * 2)
        self.holding = False
        return False
