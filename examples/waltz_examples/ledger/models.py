"""The ledger's tables, declared as Waltz entities (``docs/sql.md``, "Entities").

SmallBank's schema (Alomari et al., ICDE 2008; as in OLTPBench/BenchBase): a customer (``custid``)
has an account row, a savings balance and a checking balance, three entities with three locks,
so that a transaction reading one balance and writing the other (WriteCheck) is checked for the
write skew SmallBank exists to expose. Two more entities carry transfers across partitions:
``TransferOut`` (the outbox row the debit writes in the source partition) and ``TransferIn`` (the
row the credit writes in the target partition; its WRITE lock makes the credit happen once).

Every entity of a customer lives in partition ``custid mod num_partitions``; transfer rows in the
partition of the customer they belong to. Amounts are integers (cents).
"""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, PrimaryKeyConstraint, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import EntityRegistry, WaltzEntity

__all__ = [
    "Account",
    "AccountStatus",
    "Base",
    "Checking",
    "Savings",
    "TransferIn",
    "TransferInStatus",
    "TransferOut",
    "TransferOutStatus",
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


class Account(Base):
    """A customer (SmallBank ``ACCOUNTS``)."""

    __tablename__ = "ledger_accounts"
    __waltz__ = WaltzEntity("ledger.account", partition_by=by_customer)

    custid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(8), default=AccountStatus.OPEN.value)


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


#: One row per applied log transaction (written by ``LedgerCallbacks``), so that "every
#: transaction applied exactly once" can be checked: the primary key refuses a second apply.
applied_transactions = Table(
    "ledger_applied_transactions",
    Base.metadata,
    Column("partition_id", Integer, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("op", String(24), nullable=False),
    Column("delta", BigInteger, nullable=False),
    PrimaryKeyConstraint("partition_id", "transaction_id", name="pk_ledger_applied_transactions"),
)


def registry() -> EntityRegistry:
    """The ledger's entities."""
    return EntityRegistry([Account, Savings, Checking, TransferOut, TransferIn])
