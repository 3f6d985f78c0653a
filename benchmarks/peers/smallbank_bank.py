"""What a system under test provides the SmallBank peers' worker processes: a bank per thread.

The contract between the shared drivers (``smallbank_workers``) and a peer: a peer implements a
:class:`Backend` per worker process and a :class:`Bank` per worker thread, and gives the drivers
a module-level :data:`BackendFactory`. Each bank runs SmallBank's operations as that system runs
them (docs/design/overview.md, "Why the log is the source of truth": what a team would write
without waltz-py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from benchmarks.peers.pg_server import Database
from benchmarks.peers.smallbank_workload import Op, Options


class Outcome(NamedTuple):
    """How an operation ended.

    Attributes:
        delta: money it brought in (+) or took out (−) if it committed; None: dropped or a read.
        reason: why it was dropped (None: committed, or a Balance read).
        retried: the cause of each retry (a deadlock, a conflict...), usually empty.
    """

    delta: int | None
    reason: str | None = None
    retried: tuple[str, ...] = ()


class Bank(Protocol):
    """One worker thread's access to the system under test."""

    def execute(self, op: Op) -> Outcome:
        """Run one operation to its end, retrying deadlocks or conflicts.

        Args:
            op: the operation drawn.

        Returns:
            How it ended.

        Raises:
            Exception: the operation failed (counted as failed, the thread goes on).
        """

    def close(self) -> None:
        """Release what the bank holds (its connection); idempotent."""


class Backend(Protocol):
    """One worker process's access: makes a :class:`Bank` per thread."""

    def bank(self) -> Bank:
        """A bank for one more worker thread.

        Returns:
            The thread's bank, ready to execute operations.
        """

    def close(self) -> None:
        """Release what the process's backend holds, after its banks are closed."""


#: Makes a worker process's backend from the run's database (its name and server) and options (a
#: module-level function: it is pickled by reference into the worker processes).
BackendFactory = Callable[[Database, Options], Backend]
