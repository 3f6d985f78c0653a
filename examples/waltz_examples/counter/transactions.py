"""The counter's Waltz transactions: how a change is built, and how it is applied.

Source: docs/design/overview.md "Why the log is the source of truth" (read-modify-write races,
constraints); docs/design/locks.md "Optimistic locking in Waltz"; docs/sql.md, "Entities:
declarative locks and partitions".

:class:`ChangeCounter` is the read-modify-write: it reads the counter (a READ lock on
``counter:<id>``), checks the constraint against what it read, and writes the new value (a WRITE
lock). The framework reads the partition's high-water mark in the same database snapshot and
sends it with the append, so the server refuses the append when another transaction wrote the
counter after that mark (a lock failure): the client then waits until this database has applied
that transaction and runs :meth:`ChangeCounter.run` again, on the new value. A decrement that
would go negative is refused before anything reaches the log (``run`` returns False).

:class:`CounterCallbacks` applies the committed change-sets (every instance receives every
transaction; the shared high-water mark row makes each apply happen once per database) and sets
``updated_tx`` to the committing transaction's ID.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from waltz.client.transaction import Transaction
from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    Operation,
    RowChange,
)
from waltz_examples.counter.errors import CounterOverflowError
from waltz_examples.counter.models import MAX_VALUE, Counter

__all__ = ["COUNTER_ENTITY", "ChangeCounter", "CounterCallbacks"]

log = logging.getLogger(__name__)

#: The counter's entity name in change-sets (its lock name).
COUNTER_ENTITY = Counter.__waltz__.lock_name


class CounterCallbacks(ChangeSetCallbacks):
    """Applies counter change-sets exactly once per database; stamps ``updated_tx``.

    Args:
        engine: the application database (framework tables and ``counters`` created).
        cluster_name: the name of the log this database follows (key of its mark rows).
        ignore_foreign_transactions: True when other applications write to the same Waltz
            cluster: their transactions (command-style, or change-sets of entities this service
            does not declare) are passed over, the mark still moving past them. False (the
            default, for a cluster of the counter service's own) makes such a transaction fail
            its apply, so that a misconfigured client is noticed.
        kwargs: more :class:`~waltz.jdbc_style.ChangeSetCallbacks` arguments.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        cluster_name: str,
        ignore_foreign_transactions: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(engine, cluster_name=cluster_name, registry=EntityRegistry([Counter]), **kwargs)
        self.ignore_foreign_transactions = ignore_foreign_transactions

    def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
        """Apply one row change; a counter row gets ``updated_tx`` = the transaction's ID.

        Raises:
            ChangeSetApplyError: an update found no row (the database diverged from the log).
            UnknownEntityError: a change of an undeclared entity, unless foreign transactions
                are ignored.
        """
        if change.entity != COUNTER_ENTITY:
            if self.ignore_foreign_transactions:
                return
            super().apply_change(change, session, transaction)  # raises UnknownEntityError
            return
        if change.operation is not Operation.DELETE:
            values = {**change.values, "updated_tx": transaction.transaction_id}
            change = dataclasses.replace(change, values=values)
        super().apply_change(change, session, transaction)

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        """Pass over a command-style transaction when foreign transactions are ignored.

        Raises:
            NotImplementedError: otherwise (the counter service writes change-sets only).
        """
        if self.ignore_foreign_transactions:
            log.debug(
                "partition %d transaction %d (header %d) is not the counter service's: passed over",
                transaction.partition_id,
                transaction.transaction_id,
                transaction.header,
            )
            return
        super().apply_command(transaction, session)


class ChangeCounter(EntityTransactionContext):
    """Add ``delta`` to a counter (read-modify-write), unless the result would be negative.

    After the context ends, :attr:`new_value` holds the value written (committed), or
    :attr:`refused_at` the value that made a decrement impossible (dropped, nothing appended).

    Args:
        callbacks: the service's callbacks.
        counter_id: the counter (0 .. 2**63 - 1).
        delta: the change, positive or negative, not 0.
        timeout: seconds until the context expires between attempts (it then never commits).
        lock_failure_listener: called (on a client thread) at each lock failure, for statistics.

    Raises:
        ValueError: ``delta`` is 0.
    """

    def __init__(
        self,
        callbacks: CounterCallbacks,
        counter_id: int,
        delta: int,
        *,
        timeout: float | None = None,
        lock_failure_listener: Callable[[], None] | None = None,
    ) -> None:
        if delta == 0:
            raise ValueError("a counter change needs a non-zero delta")
        super().__init__(callbacks, (Counter, counter_id), timeout=timeout)
        self.counter_id = counter_id
        self.delta = delta
        self.new_value: int | None = None
        self.refused_at: int | None = None
        self.lock_failures = 0
        self._lock_failure_listener = lock_failure_listener

    def run(self, tx: EntityTransaction) -> bool:
        """Read the counter at the snapshot's mark and write ``value + delta``, or refuse.

        Returns:
            True to append the change, False when the counter would go negative.

        Raises:
            CounterOverflowError: the counter would exceed :data:`MAX_VALUE` (ends the context).
        """
        self.new_value = None
        self.refused_at = None
        counter = tx.get(Counter, self.counter_id)
        current = 0 if counter is None else counter.value
        new_value = current + self.delta
        if new_value < 0:
            self.refused_at = current
            return False
        if new_value > MAX_VALUE:
            raise CounterOverflowError(self.counter_id, current, self.delta, MAX_VALUE)
        if counter is None:
            tx.insert(Counter, counter_id=self.counter_id, value=new_value)
        else:
            tx.update(counter, value=new_value)
        tx.meta["delta"] = self.delta  # for audits of the log: what the caller asked
        self.new_value = new_value
        return True

    def on_lock_failure(self) -> None:
        """Count the lock failure (the client retries ``run`` once it has caught up)."""
        self.lock_failures += 1
        if self._lock_failure_listener is not None:
            self._lock_failure_listener()
