"""The inventory's entities and the two requests that change them (docs/sql.md, "Entities:
declarative locks and partitions").

A ``Sku`` row holds a SKU's stock on hand and the units reserved of it; a ``Reservation`` row holds
one request's units, under the request's idempotency key. Reservations are partitioned by their
SKU, so a reservation and the SKU it draws on are always written in one transaction of one
partition, under the SKU's lock.

:class:`Reserve` takes units only while ``reserved + quantity <= stock``: two instances reserving
the last units of a SKU at once read the same row, and the lock check lets only the first append;
the second runs again on the newer row and is refused (docs/design/sql.md, "Entity transactions").
Its ``tx.idempotency_key`` is the request's key: a retried request is answered as already applied,
and a copy of it that still reached the log changes nothing when applied (docs/design/sql.md,
"Idempotency keys").
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import (
    ChangeSetCallbacks,
    EntityTransaction,
    EntityTransactionContext,
    WaltzEntity,
    default_partition,
)

__all__ = ["Base", "InventoryContext", "Reservation", "Reserve", "SetStock", "Sku", "by_sku"]


class Base(DeclarativeBase):
    """The inventory's tables (``Base.metadata``)."""


def by_sku(key: tuple[Any, ...], num_partitions: int) -> int:
    """The partition of an entity keyed by its SKU first: the SKU's own (``default_partition``)."""
    return default_partition(key[:1], num_partitions)


class Sku(Base):
    """A SKU: units on hand (``stock``) and units reserved; never ``reserved > stock``."""

    __tablename__ = "inventory_skus"
    __waltz__ = WaltzEntity("inventory.sku", partition_by=by_sku)

    sku_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    stock: Mapped[int] = mapped_column(BigInteger, nullable=False)
    reserved: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Reservation(Base):
    """Units of a SKU reserved by one request (its ``idempotency_key``); its ID is the instance's."""

    __tablename__ = "inventory_reservations"
    __waltz__ = WaltzEntity("inventory.reservation", partition_by=by_sku)

    sku_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    reservation_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    quantity: Mapped[int] = mapped_column(Integer, nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(200), nullable=False, index=True)


class InventoryContext(EntityTransactionContext):
    """A transaction on one SKU; counts its attempts refused by the lock check.

    Attributes:
        lock_failures: attempts that failed the lock check (each was run again).
    """

    def __init__(self, callbacks: ChangeSetCallbacks, sku_id: int) -> None:
        super().__init__(callbacks, (Sku, sku_id))
        self.sku_id = sku_id
        self.lock_failures = 0

    def on_lock_failure(self) -> None:
        self.lock_failures += 1


class SetStock(InventoryContext):
    """Set a SKU's stock on hand, creating the SKU (nothing reserved) on its first call.

    Dropped when the new stock is below what is reserved.
    """

    def __init__(self, callbacks: ChangeSetCallbacks, sku_id: int, stock: int) -> None:
        super().__init__(callbacks, sku_id)
        if stock < 0:
            raise ValueError(f"stock must be at least 0 units, got {stock}")
        self.stock = stock

    def run(self, tx: EntityTransaction) -> bool:
        """Write the stock, or drop when it is below the units reserved."""
        sku = tx.get(Sku, self.sku_id)
        if sku is None:
            tx.insert(Sku, sku_id=self.sku_id, stock=self.stock, reserved=0)
        elif sku.reserved > self.stock:
            return tx.drop(f"SKU {self.sku_id} has {sku.reserved} units reserved, more than {self.stock}")
        else:
            tx.update(sku, stock=self.stock)
        return True


class Reserve(InventoryContext):
    """Reserve ``quantity`` units of a SKU for the request ``idempotency_key``.

    Refused (dropped, with the reason) when the SKU is missing or fewer units are left. A request
    whose key was applied before is answered as already applied: by the framework before an append
    (``checks_idempotency_key``), and here before a refusal, since a retry of the request that took
    the last units would otherwise be refused.

    Args:
        callbacks: the instance's callbacks.
        sku_id: the SKU.
        quantity: units, at least 1.
        idempotency_key: the caller's key of the request.
        reservation_id: the reservation's ID (default: a new random one; a retry gets another).
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        sku_id: int,
        quantity: int,
        idempotency_key: str,
        reservation_id: str | None = None,
    ) -> None:
        super().__init__(callbacks, sku_id)
        if quantity < 1:
            raise ValueError(f"a reservation takes at least 1 unit, got {quantity}")
        self.quantity = quantity
        self.idempotency_key = idempotency_key
        self.reservation_id = reservation_id or uuid.uuid4().hex

    def run(self, tx: EntityTransaction) -> bool:
        """Take the units and record the reservation, or refuse the request."""
        tx.idempotency_key = self.idempotency_key
        sku = tx.get(Sku, self.sku_id)
        left = 0 if sku is None else sku.stock - sku.reserved
        if sku is None or left < self.quantity:
            if tx.already_applied(self.idempotency_key) is not None:
                return True  # a retry of an applied request: answered as already applied
            if sku is None:
                return tx.drop(f"no SKU {self.sku_id}")
            return tx.drop(f"not enough stock: SKU {self.sku_id} has {left} units left")
        tx.update(sku, reserved=sku.reserved + self.quantity)
        tx.insert(
            Reservation,
            sku_id=self.sku_id,
            reservation_id=self.reservation_id,
            quantity=self.quantity,
            idempotency_key=self.idempotency_key,
        )
        return True
