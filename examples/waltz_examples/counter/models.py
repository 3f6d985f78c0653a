"""The counter service's table: one row per counter, never negative.

Source: docs/design/overview.md "Why the log is the source of truth" (a counter that must not go
negative); docs/design/locks.md "Optimistic locking in Waltz". The model declares its Waltz identity
(``__waltz__``), so the SQL framework derives its lock (``counter:<counter_id>``) and its partition
from the key, and applies the change-sets that :mod:`waltz_examples.counter.service` submits.

The ``CHECK (value >= 0)`` constraint is a second line of defence only: the service refuses a
decrement before it reaches the log, so a negative value would mean a bug, and its apply would
fail (and be retried, never skipped) instead of storing it.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import WaltzEntity

__all__ = ["MAX_VALUE", "Base", "Counter", "create_tables"]

#: The largest value a counter (a signed 64-bit ``BIGINT``) can hold.
MAX_VALUE = (1 << 63) - 1


class Base(DeclarativeBase):
    """The declarative base of the counter service's models."""


class Counter(Base):
    """A counter (table ``counters``).

    Attributes:
        counter_id: the counter's ID, chosen by the caller (0 .. 2**63 - 1); it is also the lock
            ID, so counters spread over partitions by a stable hash of it.
        value: the current value, never negative.
        updated_tx: the ID of the Waltz transaction that last wrote the row (for audits: the log
            holds the change-set that set ``value``). The apply sets it; the value carried in the
            change-set itself is not used, since a transaction's ID is known only once it is
            committed.
    """

    __tablename__ = "counters"
    __table_args__ = (CheckConstraint("value >= 0", name="counters_value_not_negative"),)
    __waltz__ = WaltzEntity("counter")

    counter_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    updated_tx: Mapped[int] = mapped_column(BigInteger, nullable=False, default=-1)

    def __repr__(self) -> str:
        return f"Counter(counter_id={self.counter_id}, value={self.value}, updated_tx={self.updated_tx})"


def create_tables(engine: Engine) -> None:
    """Create the ``counters`` table if it does not exist (``metadata.create_all``, checkfirst).

    Good enough for an example; a service whose schema evolves keeps it in alembic migrations
    (see ``examples/waltz_examples/ledger``).

    Args:
        engine: the application database.

    Raises:
        sqlalchemy.exc.DBAPIError: the database could not be reached or refused the DDL.
    """
    Base.metadata.create_all(engine, checkfirst=True)
