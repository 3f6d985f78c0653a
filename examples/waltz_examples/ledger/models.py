"""The ledger's tables, declared as Waltz entities (``docs/sql.md``, "Entities").

SmallBank's schema (Alomari et al., ICDE 2008; as in OLTPBench/BenchBase): a customer (``custid``)
has an account row, a savings balance and a checking balance, three entities with three locks,
so that a transaction reading one balance and writing the other (WriteCheck) is checked for the
write skew SmallBank exists to expose. Two more entities carry transfers across partitions:
``TransferOut`` (the outbox row the debit writes in the source partition) and ``TransferIn`` (the
row the credit writes in the target partition; its WRITE lock makes the credit happen once).

Every entity of a customer lives in partition ``custid mod num_partitions``; transfer rows in the
partition of the customer they belong to. Amounts are integers (cents).

``Account`` has changed twice since the ledger's first release (docs/sql.md, "Changing a model"):
version 2 added ``currency``, version 3 renamed ``name`` to ``holder``. Its upcasters take the
log's older changes to this version, the alembic migrations in ``migrations/`` take the table
there, and ``releases.py`` keeps the models of the earlier releases, which the demo starts on.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from sqlalchemy import BigInteger, Column, Integer, PrimaryKeyConstraint, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import AddAttribute, ChangeSetCallbacks, EntityRegistry, RenameAttribute, WaltzEntity

__all__ = [
    "ACCOUNT",
    "Account",
    "AccountStatus",
    "Base",
    "Checking",
    "Savings",
    "TransferIn",
    "TransferInStatus",
    "TransferOut",
    "TransferOutStatus",
    "account_model",
    "applied_transactions",
    "by_customer",
    "registry",
]


def by_customer(key: tuple[Any, ...], num_partitions: int) -> int:
    """Partition of a customer's entities: ``custid mod num_partitions`` (the key's first value)."""
    return int(key[0]) % num_partitions


class Base(DeclarativeBase):
    """The ledger's declarative base."""


class AccountStatus(enum.StrEnum):
    """An account is open until deactivated; a closed account takes no debits or credits."""

    OPEN = "open"
    CLOSED = "closed"


class TransferOutStatus(enum.StrEnum):
    """The source side of a transfer: pending until credited or refunded."""

    PENDING = "pending"
    CREDITED = "credited"
    REFUNDED = "refunded"


class TransferInStatus(enum.StrEnum):
    """The target side: credited, or rejected (closed or missing account: the source refunds)."""

    CREDITED = "credited"
    REJECTED = "rejected"


#: The account's entity name (its lock name, in every change-set).
ACCOUNT = "ledger.account"


class Account(Base):
    """A customer (SmallBank ``ACCOUNTS``), at schema version 3.

    Version 1 had ``custid``, ``name`` and ``status``; version 2 added ``currency``, ``USD`` for
    every account opened before it (the upcaster, the migration's server default and the
    attribute's default say the same); version 3 renamed ``name`` to ``holder``.
    """

    __tablename__ = "ledger_accounts"
    __waltz__ = WaltzEntity(
        ACCOUNT,
        partition_by=by_customer,
        schema_version=3,
        upcasters=(
            AddAttribute(1, "currency", "USD"),  # 1 -> 2: migration ledger_0002 adds the column
            RenameAttribute(2, "name", "holder"),  # 2 -> 3: migration ledger_0003 renames it
        ),
    )
    #: The attribute that holds the holder's name (``name`` in the older releases' models).
    holder_attribute: ClassVar[str] = "holder"

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(8), default=AccountStatus.OPEN.value)
    currency: Mapped[str] = mapped_column(String(3), default="USD", server_default="USD")


class Savings(Base):
    """A savings balance (SmallBank ``SAVINGS``); never below zero."""

    __tablename__ = "ledger_savings"
    __waltz__ = WaltzEntity("ledger.savings", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column(BigInteger, default=0)


class Checking(Base):
    """A checking balance (SmallBank ``CHECKING``); only WriteCheck's overdraft takes it below zero."""

    __tablename__ = "ledger_checking"
    __waltz__ = WaltzEntity("ledger.checking", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column(BigInteger, default=0)


class TransferOut(Base):
    """The outbox row of a transfer, written by the debit in the source partition."""

    __tablename__ = "ledger_transfers_out"
    __waltz__ = WaltzEntity("ledger.transfer_out", partition_by=by_customer)

    from_custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    transfer_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    to_custid: Mapped[int] = mapped_column(BigInteger)
    amount: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(8), default=TransferOutStatus.PENDING.value, index=True)


class TransferIn(Base):
    """The target side of a transfer, written by the credit in the target partition."""

    __tablename__ = "ledger_transfers_in"
    __waltz__ = WaltzEntity("ledger.transfer_in", partition_by=by_customer)

    to_custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    transfer_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    from_custid: Mapped[int] = mapped_column(BigInteger)
    amount: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(8))


#: One row per applied change-set (written by ``LedgerCallbacks``): per log transaction, and per
#: member of a batched one (``member``: its place in the batch, 0 for a transaction of one
#: change-set), so that "every (transaction, member) applied exactly once" can be checked: the
#: primary key refuses a second apply.
applied_transactions = Table(
    "ledger_applied_transactions",
    Base.metadata,
    Column("partition_id", Integer, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("op", String(24), nullable=False),
    Column("delta", BigInteger, nullable=False),
    # Added by ledger_0004; no Python default, so that an insert without it leaves it out (an
    # earlier release's table has no such column) and the server fills it.
    Column("member", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("partition_id", "transaction_id", "member", name="pk_ledger_applied_transactions"),
)


def registry(account: type[Any] = Account) -> EntityRegistry:
    """The ledger's entities, with this module's ``Account`` or an older release's
    (:mod:`waltz_examples.ledger.releases`)."""
    return EntityRegistry([account, Savings, Checking, TransferOut, TransferIn])


def account_model(callbacks: ChangeSetCallbacks) -> type[Any]:
    """The ``Account`` model an instance runs: its callbacks' (this module's, or an older release's)."""
    return callbacks.registry.by_name(ACCOUNT).model
