"""The client's routing by partition epochs: which partition and epoch a context's append goes to.

Source: docs/design/splits.md "The routing rule" (a divisible partition function), "Clients across
a split" (route by the newest count whose parent for the key is sealing; every append carries the
epoch it was routed by; a refused context waits for the epochs' watch to move and runs again);
"The epochs znode's record form" (the value read). The client keeps one immutable
:class:`RoutingView` of ``<root>/partitions/epochs``, replaced whenever its watch reports a change
(:class:`EpochRouting`); routing a context reads that view and costs a few integer operations per
epoch, no ZooKeeper read. A cluster that never split has no epoch: every context goes to
``partition_id(count of discovery)`` with epoch 0, as before splits existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from waltz.metadata.epochs import EpochState, PartitionEpochs

__all__ = [
    "EPOCH_WAIT_SECONDS",
    "EpochRouting",
    "PartitionRouter",
    "Route",
    "RoutingView",
    "SplitOrigin",
    "opened_children",
    "route_by_epochs",
]

#: Seconds at most a context without a timeout of its own waits for the epochs to move after a
#: refusal of its epoch, or for its new partition to be open (the client's default request
#: timeout, ``DEFAULT_REQUEST_TIMEOUT``).
EPOCH_WAIT_SECONDS = 30.0


class Route(NamedTuple):
    """Where a context's append goes.

    Attributes:
        partition_id: the partition.
        epoch: the epoch it was routed by (0: the count the cluster was created with).
    """

    partition_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class SplitOrigin:
    """Where a new child of a split starts (docs/design/splits.md "Clients across a split").

    Attributes:
        child: the new partition.
        epoch: the epoch it belongs to.
        parent: its parent, ``child mod previous_count``.
        barrier: the parent's ``B(p)``: the child's **floor** (its log starts after it, with the
            genesis at ``B(p) + 1``; the client mounts it from there and never reads its mark below).
    """

    child: int
    epoch: int
    parent: int
    barrier: int

    @property
    def genesis(self) -> int:
        """The transaction ID of the child's genesis, ``B(p) + 1``."""
        return self.barrier + 1


def opened_children(epochs: PartitionEpochs) -> dict[int, SplitOrigin]:
    """Every new child of every epoch that is marked opened (its parent's ``B(p)`` is then known,
    "The epochs znode's record form"), by partition ID: the partitions a client makes beside those
    of the count at creation (docs/design/splits.md "Clients across a split")."""
    children: dict[int, SplitOrigin] = {}
    for epoch in epochs.epochs:
        for child, progress in sorted(epoch.children.items()):
            if not progress.opened:
                continue
            parent, barrier = epoch.parent_barrier(child)
            if barrier is not None:  # always known once opened; a hand-written znode is skipped
                children[child] = SplitOrigin(child, epoch.number, parent, barrier)
    return children


class PartitionRouter(Protocol):
    """What routes a key by the client's view of the partition epochs (``WaltzClient``): taken
    where a partition count was (``partition_of``, ``read_entities``; docs/design/splits.md
    "Clients across a split")."""

    def partition_for(self, choose: Callable[[int], int]) -> int:
        """The partition a key goes to now: ``choose(count)`` at the newest count, routed down
        while the key's parent is not sealing (see :meth:`RoutingView.partition_for`)."""
        ...

    def first_transaction_id(self, partition_id: int) -> int:
        """Where the partition's log starts: 0, or for a new partition of a split its genesis,
        ``B(p) + 1`` (docs/design/splits.md "The handover", step 4)."""
        ...


#: One epoch as routing reads it, newest first: (its number, its previous count, the parents that
#: route to the epoch, or None when every parent does: a complete epoch).
_Step = tuple[int, int, frozenset[int] | None]


def _steps(epochs: PartitionEpochs) -> tuple[_Step, ...]:
    steps: list[_Step] = []
    for epoch in reversed(epochs.epochs):
        sealing = (
            None
            if epoch.state is EpochState.COMPLETE
            else frozenset(p for p, progress in epoch.parents.items() if progress.sealing)
        )
        steps.append((epoch.number, epoch.previous_count, sealing))
    return tuple(steps)


def route_by_epochs(epochs: PartitionEpochs, partition_id: int) -> Route:
    """Route a key whose partition at the newest count is ``partition_id``
    (docs/design/splits.md "Clients across a split").

    From the newest epoch ``n+1`` down: the key's partition ``c`` at ``C(n+1)`` has the parent
    ``c mod C(n)``; when that parent is sealing (or the epoch is complete) the append goes to ``c``
    with epoch ``n+1``, else the key's partition at ``C(n)`` is that parent and the epoch before is
    asked the same (``f(key, C(n)) = f(key, C(n+1)) mod C(n)`` for a divisible ``f``, "The routing
    rule"). With no epoch at all: ``partition_id`` with epoch 0.

    Args:
        epochs: the value of ``<root>/partitions/epochs``.
        partition_id: ``f(key, epochs.current_count)``, ``0 <= partition_id < current_count``.

    Returns:
        The route; its partition may be a new child that is not open yet.

    Raises:
        ValueError: ``partition_id`` is outside ``0 .. current_count - 1``.
    """
    return RoutingView.of(epochs, -1, 0).route(partition_id)


@dataclass(frozen=True, slots=True)
class RoutingView:
    """The client's view of ``<root>/partitions/epochs`` at one version (immutable).

    Attributes:
        epochs: the znode's value (no epoch and the count of ``discovery`` when it does not exist).
        version: the znode's version (-1: it does not exist).
        serial: this client's count of the views it took, from 0: a wait for "the watch moved"
            waits for a higher serial.
        count: the newest count, finished or not: what ``TransactionContext.partition_id`` is
            asked with.
        partition_ids: the partitions that exist (``PartitionEpochs.partition_ids``).
        first_ids: each new partition's first transaction ID, its genesis ``B(p) + 1``
            (``PartitionEpochs.first_transaction_ids``); a partition not named starts at 0.
    """

    epochs: PartitionEpochs
    version: int
    serial: int
    count: int
    _steps: tuple[_Step, ...]
    partition_ids: tuple[int, ...]
    first_ids: Mapping[int, int]

    @classmethod
    def of(cls, epochs: PartitionEpochs, version: int, serial: int) -> RoutingView:
        """The view of ``epochs`` read at ``version``, the client's ``serial``-th (what the
        clients read of it is derived once, here)."""
        return cls(
            epochs,
            version,
            serial,
            epochs.current_count,
            _steps(epochs),
            epochs.partition_ids,
            epochs.first_transaction_ids,
        )

    @property
    def epoch(self) -> int:
        """The newest epoch's number, finished or not (0: the cluster never split)."""
        return self.epochs.current_number

    def count_of(self, epoch: int) -> int:
        """The partition count of ``epoch`` (0: the count at creation) in this view."""
        return self.epochs.count_of(epoch)

    def partition_for(self, choose: Callable[[int], int]) -> int:
        """The partition a key goes to by this view: ``choose(count)`` (the key's partition at
        :attr:`count`, the partition function's), routed (:meth:`route`).

        Raises:
            ValueError: ``choose`` gave a partition outside ``0 .. count - 1``.
        """
        return self.route(choose(self.count)).partition_id

    def route(self, partition_id: int) -> Route:
        """Route a key whose partition at :attr:`count` is ``partition_id`` (see
        :func:`route_by_epochs`).

        Raises:
            ValueError: ``partition_id`` is outside ``0 .. count - 1``.
        """
        if not 0 <= partition_id < self.count:
            raise ValueError(f"partition {partition_id} is outside 0..{self.count - 1}")
        c = partition_id
        for number, previous_count, sealing in self._steps:
            parent = c % previous_count
            if sealing is None or parent in sealing:
                return Route(c, number)
            c = parent
        return Route(c, 0)


class EpochRouting:
    """The client's current :class:`RoutingView`, replaced by the epochs' watch, and waits for it
    to move. Thread-safe: the watch replaces it on a ZooKeeper thread, the attempt path reads it on
    any thread and waits on the client's event loop.

    Args:
        initial_count: the partition count of ``discovery`` (the view before the first read).
    """

    def __init__(self, initial_count: int) -> None:
        self._view = RoutingView.of(PartitionEpochs(initial_count), -1, 0)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def view(self) -> RoutingView:
        """The view now (one attribute read: the hot path's)."""
        return self._view

    def wake(self) -> None:
        """Take the same value again as a new view (a higher serial) and wake the waiters: the
        client made the partitions of children it did not have, and contexts waiting for them
        route again (any thread)."""
        with self._lock:
            current = self._view
            self._view = RoutingView.of(current.epochs, current.version, current.serial + 1)
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop closed
                loop.call_soon_threadsafe(_wake, future)

    def update(self, epochs: PartitionEpochs, version: int) -> bool:
        """Take a new value of the znode (any thread; the watch calls it in the znode's order).

        Returns:
            True when it differs from the view's (a new view, a higher serial, waiters woken);
            False when it is the same.
        """
        with self._lock:
            current = self._view
            if current.version == version and current.epochs == epochs:
                return False
            self._view = RoutingView.of(epochs, version, current.serial + 1)
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop closed
                loop.call_soon_threadsafe(_wake, future)
        return True

    async def wait_newer(self, serial: int, timeout: float) -> bool:
        """Wait (on the running loop) until the view's serial is above ``serial``.

        Args:
            serial: the serial of the view a context was routed by.
            timeout: seconds at most (0 or less: only look).

        Returns:
            True when the view moved, False after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._view.serial > serial:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, remaining)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
