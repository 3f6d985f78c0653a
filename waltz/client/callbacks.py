"""The application's side of the client: high-water marks and applying transactions.

Source: docs/design/client.md "Transaction contexts and callbacks", "Applying transactions".
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from waltz.client.transaction import Transaction

__all__ = ["WaltzClientCallbacks"]


class WaltzClientCallbacks(abc.ABC):
    """What a :class:`~waltz.client.client.WaltzClient` asks of the application.

    ``apply_transaction`` runs on a worker thread per partition, strictly in transaction-ID
    order, never twice for one ID within a client; blocking code (a database) is fine there.
    Several application instances may share one database: each sees every transaction, and
    the callbacks must skip those already applied (the high-water mark tells).
    """

    #: True when the application reads the data of (nearly) every transaction it applies: the
    #: client then fetches a whole apply batch's data concurrently before the apply call, instead
    #: of one blocking fetch per ``get_data``. False keeps the data lazy (docs/design/client.md
    #: "Appends, the feed and flush").
    prefetch_transaction_data: bool = False

    @abc.abstractmethod
    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The highest transaction ID of ``partition_id`` applied to the application (-1: none).

        Called before every attempt of a context and on every mount (the feed restarts after it).
        """

    @abc.abstractmethod
    def apply_transaction(self, transaction: Transaction) -> None:
        """Apply a committed transaction and advance the high-water mark to its ID, atomically.

        Raises:
            Exception: the client reports it with :meth:`uncaught_exception` and calls again with
                the same transaction after a backoff; it never skips a transaction.
        """

    @abc.abstractmethod
    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """Report an exception raised by :meth:`apply_transaction` (or :meth:`apply_transactions`,
        then ``transaction_id`` is the first of the batch)."""

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        """Optional hook: apply several consecutive transactions of one partition at once.

        Override it to apply a batch in one database transaction (all or nothing): the client then
        hands up to ``client.maxApplyBatchSize`` consecutive transactions, in ID order, whenever
        more than one is waiting. On an exception the client reports it with
        :meth:`uncaught_exception` and retries the same batch. The default applies one by one.
        """
        for transaction in transactions:
            self.apply_transaction(transaction)

    @property
    def absorbs_transactions(self) -> bool:
        """True when the application keeps state of its own that follows the log ahead of its
        applies (the SQL framework's entity cache): the client then loads each apply batch's data,
        calls :meth:`absorb_transactions` with it before the apply, and lets the contexts that
        read that state (``TransactionContext.reads_absorbed_state``) run again as soon as a
        transaction is absorbed rather than applied (docs/design/client.md "Applying
        transactions"). The default: False."""
        return False

    def absorb_transactions(self, transactions: Sequence[Transaction]) -> None:
        """Optional hook: consecutive committed transactions of one partition, in ID order, with
        their data loaded, before they are applied (only when :attr:`absorbs_transactions`).

        Must not raise: an exception is logged and the client goes on (the state it feeds must
        then make its readers fall back on the database).
        """
        return None

    def absorb_floor(self, partition_id: int, mark: int) -> None:
        """Optional hook: every transaction of the partition up to ``mark`` is applied already
        (found in the database at a mount), and those will not be absorbed one by one. Must not
        raise."""
        return None

    def absorb_stopped(self, partition_id: int) -> None:
        """Optional hook: this client stopped following the partition (it unmounted it, or is
        closing), after its last absorb and apply of it; nothing more of the partition is absorbed
        until a mount floors it again (:meth:`absorb_floor`). State kept as absorbed would fall
        behind the log from here. Must not raise."""
        return None

    def client_closed(self) -> None:
        """Optional hook: a client using these callbacks closed (after its apply workers stopped).

        Release what the callbacks keep for the client (idle database connections, say); they
        may be used again by another client. The default does nothing. An exception is logged.
        """
        return None
