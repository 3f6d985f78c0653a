"""What a system under test provides the SmallBank peers' worker processes: a bank per thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

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
        """Run one operation to its end (retrying deadlocks or conflicts); raises on an error."""

    def close(self) -> None: ...


class Backend(Protocol):
    """One worker process's access: makes a :class:`Bank` per thread."""

    def bank(self) -> Bank: ...

    def close(self) -> None: ...


#: Makes a worker process's backend from the run's database name and options (a module-level
#: function: it is pickled by reference into the worker processes).
BackendFactory = Callable[[str, Options], Backend]
