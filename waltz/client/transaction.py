"""A committed transaction as the application sees it, with its data loaded lazily.

Source: docs/design/client.md "Appends, the feed and flush" (lazy loading of transaction data);
``docs/protocol.md`` "Transaction data". The feed carries only the transaction ID, the ReqId and the
header; the data is fetched with the ``GetTransactionDataRange`` RPC the first time the application
asks for it, checked against its CRC-32, and kept. The data of this client's own appends is already
known and never fetched.
"""

from __future__ import annotations

import threading
from typing import Protocol, TypeVar

from waltz.client.context import Serializer
from waltz.protocol.records import ReqId

__all__ = ["Transaction", "TransactionDataSource"]

T = TypeVar("T")

_LOCK_GUARD = threading.Lock()  # makes each transaction's fetch lock once


class TransactionDataSource(Protocol):
    """Fetches a committed transaction's data (the client's RPC side)."""

    def fetch(self, partition_id: int, transaction_id: int) -> bytes:
        """The data, CRC-checked; blocks, retrying with backoff.

        Raises:
            TransactionDataError: not fetched in time, or the CRC-32 never matched.
            ClientClosedError: the client closed.
        """
        ...

    async def fetch_async(self, partition_id: int, transaction_id: int) -> bytes:
        """As :meth:`fetch`, for coroutines."""
        ...

    def fetch_many(self, partition_id: int, transaction_ids: list[int]) -> list[bytes]:
        """:meth:`fetch` for several transactions at once, in the order given."""
        ...


class Transaction:
    """A committed transaction handed to ``WaltzClientCallbacks.apply_transaction``.

    Attributes:
        partition_id: the partition.
        transaction_id: its ID (dense, increasing per partition).
        req_id: the ReqId of the append that wrote it (the writer's client ID, ...).
        header: the application-defined 32-bit header.
    """

    __slots__ = ("_data", "_lock", "_source", "header", "partition_id", "req_id", "transaction_id")

    def __init__(
        self,
        partition_id: int,
        transaction_id: int,
        req_id: ReqId,
        header: int,
        source: TransactionDataSource | None,
        data: bytes | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.req_id = req_id
        self.header = header
        self._source = source
        self._data = data
        self._lock: threading.Lock | None = None  # made on the first fetch (see _fetch_lock)

    def __repr__(self) -> str:
        return (
            f"Transaction(partition_id={self.partition_id}, transaction_id={self.transaction_id}, "
            f"req_id={self.req_id}, header={self.header})"
        )

    @property
    def data_loaded(self) -> bool:
        """True when the data is here (this client's own append, or fetched already)."""
        return self._data is not None

    def _fetch_lock(self) -> threading.Lock:
        """This transaction's lock around fetching its data, made when first needed (most
        transactions are applied without a fetch: a lock each would cost more than they do)."""
        lock = self._lock
        if lock is None:
            with _LOCK_GUARD:
                lock = self._lock
                if lock is None:
                    lock = self._lock = threading.Lock()
        return lock

    def _set_data(self, data: bytes) -> None:
        with self._fetch_lock():
            if self._data is None:
                self._data = data

    @staticmethod
    def load_data(transactions: list[Transaction]) -> None:
        """Fetch the data of those not loaded yet, all at once (one source, one partition).

        Raises:
            TransactionDataError: a fetch failed (see :meth:`get_raw_data`).
            ClientClosedError: the client closed.
        """
        missing = [t for t in transactions if t._data is None and t._source is not None]
        if not missing:
            return
        source = missing[0]._source
        assert source is not None
        pid = missing[0].partition_id
        datas = source.fetch_many(pid, [t.transaction_id for t in missing])
        for transaction, data in zip(missing, datas, strict=True):
            transaction._set_data(data)

    def get_raw_data(self) -> bytes:
        """The transaction data; fetched over RPC (blocking) the first time, then kept.

        Do not call it on the client's event loop (use :meth:`get_raw_data_async`).

        Raises:
            TransactionDataError: the data could not be fetched in time or failed its CRC check.
            ClientClosedError: the client closed.
        """
        with self._fetch_lock():
            if self._data is None:
                if self._source is None:
                    raise RuntimeError(f"{self!r} has no data source")
                self._data = self._source.fetch(self.partition_id, self.transaction_id)
            return self._data

    async def get_raw_data_async(self) -> bytes:
        """As :meth:`get_raw_data`, for coroutines."""
        if self._data is None:
            if self._source is None:
                raise RuntimeError(f"{self!r} has no data source")
            self._data = await self._source.fetch_async(self.partition_id, self.transaction_id)
        return self._data

    def get_data(self, serializer: Serializer[T]) -> T:
        """The transaction data decoded with ``serializer`` (fetched lazily, see :meth:`get_raw_data`)."""
        return serializer.deserialize(self.get_raw_data())

    async def get_data_async(self, serializer: Serializer[T]) -> T:
        """As :meth:`get_data`, for coroutines."""
        return serializer.deserialize(await self.get_raw_data_async())
