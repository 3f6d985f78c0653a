"""The wallet's one entity and the two requests that change it (docs/sql.md, "Entities: declarative
locks and partitions").

A wallet is a row keyed by its ID, locked by the framework under the lock name ``wallet``; its
partition is the default one of its key. A deposit opens the wallet on its first call, and is
dropped, with a reason, when it would take the balance above :data:`MAX_BALANCE`; a withdrawal
is dropped when it would take the balance below zero. Both record the caller's
request ID as the transaction's idempotency key, so a retried request is applied once.
"""

from __future__ import annotations

from sqlalchemy import BigInteger
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import ChangeSetCallbacks, EntityTransaction, EntityTransactionContext, WaltzEntity

__all__ = ["MAX_BALANCE", "Base", "Deposit", "Wallet", "Withdraw"]

#: The largest balance a wallet holds, in cents: PostgreSQL's ``BIGINT``, SQLite's ``INTEGER``.
MAX_BALANCE = (1 << 63) - 1


class Base(DeclarativeBase):
    """The wallet's tables (``Base.metadata``)."""


class Wallet(Base):
    """A wallet and its balance, in cents."""

    __tablename__ = "wallets"
    __waltz__ = WaltzEntity("wallet")

    wallet_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column(BigInteger, nullable=False)


class Deposit(EntityTransactionContext):
    """Add ``amount`` cents to a wallet, opening it if it does not exist.

    Args:
        callbacks: the instance's callbacks.
        wallet_id: the wallet's ID.
        amount: cents, above zero.
        request_id: the caller's ID of the request, recorded as the idempotency key.
        timeout: seconds until the context expires, or None (docs/design/client.md).
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        wallet_id: int,
        amount: int,
        request_id: str,
        timeout: float | None = None,
    ) -> None:
        super().__init__(callbacks, (Wallet, wallet_id), timeout=timeout)
        self.wallet_id, self.amount, self.request_id = wallet_id, amount, request_id

    def run(self, tx: EntityTransaction) -> bool:
        """Write the new balance (a new row on the wallet's first deposit), or drop the request
        when the new balance would exceed :data:`MAX_BALANCE`: appended, such a change could never
        be applied (``BIGINT``), and the partition's later transactions would wait behind it for
        ever (docs/design/sql.md "Skipping a transaction")."""
        tx.idempotency_key = self.request_id
        wallet = tx.get(Wallet, self.wallet_id)
        held = 0 if wallet is None else wallet.balance
        if held + self.amount > MAX_BALANCE:
            return tx.drop(
                f"balance overflow: wallet {self.wallet_id} holds {held} cents; "
                f"a deposit of {self.amount} would take it above {MAX_BALANCE}"
            )
        if wallet is None:
            tx.insert(Wallet, wallet_id=self.wallet_id, balance=self.amount)
        else:
            tx.update(wallet, balance=held + self.amount)
        return True


class Withdraw(EntityTransactionContext):
    """Take ``amount`` cents from a wallet; dropped when the wallet is missing or holds less.

    The balance read here is the one the append is checked against: if another transaction wrote
    the wallet since, the append is refused and ``run`` runs again on the newer balance, so
    concurrent withdrawals never take the balance below zero (docs/design/sql.md).

    Args:
        callbacks: the instance's callbacks.
        wallet_id: the wallet's ID.
        amount: cents, above zero.
        request_id: the caller's ID of the request, recorded as the idempotency key.
        timeout: seconds until the context expires, or None (docs/design/client.md).
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        wallet_id: int,
        amount: int,
        request_id: str,
        timeout: float | None = None,
    ) -> None:
        super().__init__(callbacks, (Wallet, wallet_id), timeout=timeout)
        self.wallet_id, self.amount, self.request_id = wallet_id, amount, request_id

    def run(self, tx: EntityTransaction) -> bool:
        """Write the lower balance, or drop the request with the reason.

        The framework reads the idempotency key of a dropped request too, so a retry of a
        withdrawal that emptied the wallet ends already applied either way (docs/sql.md,
        "Idempotency keys"); reading it here first shows where a service would answer such a
        retry its own way.
        """
        tx.idempotency_key = self.request_id
        wallet = tx.get(Wallet, self.wallet_id)
        if wallet is None or wallet.balance < self.amount:
            if tx.already_applied(self.request_id) is not None:
                # A retry of a withdrawal applied before (which may have emptied the wallet):
                # returning True lets the framework answer it as already applied, appending nothing.
                return True
            if wallet is None:
                return tx.drop(f"no wallet {self.wallet_id}")
            return tx.drop(f"insufficient funds: wallet {self.wallet_id} holds {wallet.balance}")
        tx.update(wallet, balance=wallet.balance - self.amount)
        return True
