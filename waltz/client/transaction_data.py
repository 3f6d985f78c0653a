"""Fetching the data of committed transactions: the ``GetTransactionData`` RPC, retried.

Source: seed 000 "Transaction Data Request/Response", "InternalRpcClient"; ``docs/protocol.md``.
The request goes to the server that owns the partition now (it may move while we retry); the data
is checked against its CRC-32. Transient failures (no owner, a connection lost under the call, the
server not ready, a bad checksum) are retried with exponential backoff (tenacity) until
``client.transactionDataTimeout``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping

import grpc
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential

from waltz.client.connection_pool import ConnectionPool
from waltz.client.partition import ClientPartition
from waltz.errors import ClientClosedError, TransactionDataError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId, crc32

__all__ = ["REQUEST_TIMEOUT", "TransactionDataClient"]

#: Seconds one GetTransactionData call may take before it is tried again.
REQUEST_TIMEOUT = 5.0


class _TransientDataError(Exception):
    """A GetTransactionData attempt failed in a way worth retrying."""


class TransactionDataClient:
    """The client's :class:`~waltz.client.transaction.TransactionDataSource`.

    Args:
        loop: the client's event loop, and its thread.
        pool: the client's connections.
        partitions: the client's partitions (for each one's owner and generation).
        client_id: the client ID (for ReqIds).
        next_seq_num: the client's ReqId sequence (loop only).
        timeout: seconds to keep retrying one fetch.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        pool: ConnectionPool,
        partitions: Mapping[int, ClientPartition],
        client_id: int,
        next_seq_num: Callable[[], int],
        timeout: float,
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._pool = pool
        self._partitions = partitions
        self._client_id = client_id
        self._next_seq_num = next_seq_num
        self._timeout = timeout
        self.open = True
        """False once the client closed (after its apply workers stopped)."""

    def _check_open(self) -> None:
        if not self.open:
            raise ClientClosedError(
                f"Waltz client {self._client_id} is closed; transaction data is unavailable"
            )

    def fetch(self, partition_id: int, transaction_id: int) -> bytes:
        """Fetch a transaction's data, blocking (not on the client's event loop).

        Raises:
            TransactionDataError: not fetched within ``client.transactionDataTimeout``.
            ClientClosedError: the client closed.
            RuntimeError: called on the client's event loop thread.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("Transaction.get_data blocks: use get_data_async on the client's event loop")
        self._check_open()
        future = asyncio.run_coroutine_threadsafe(self._fetch(partition_id, transaction_id), self._loop)
        try:
            return future.result(self._timeout + 10)
        except concurrent.futures.TimeoutError:
            self._check_open()
            raise

    def fetch_many(self, partition_id: int, transaction_ids: list[int]) -> list[bytes]:
        """Fetch several transactions' data at once (concurrent requests), blocking.

        The apply worker uses it to load a whole apply batch in one round trip's time instead of
        one per transaction.

        Raises:
            TransactionDataError: one of them was not fetched within ``client.transactionDataTimeout``.
            ClientClosedError: the client closed.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("fetch_many blocks: not on the client's event loop")
        self._check_open()

        async def gather() -> list[bytes]:
            return list(await asyncio.gather(*(self._fetch(partition_id, t) for t in transaction_ids)))

        future = asyncio.run_coroutine_threadsafe(gather(), self._loop)
        try:
            return future.result(self._timeout + 10)
        except concurrent.futures.TimeoutError:
            self._check_open()
            raise

    async def fetch_async(self, partition_id: int, transaction_id: int) -> bytes:
        """As :meth:`fetch`, from any event loop."""
        self._check_open()
        if asyncio.get_running_loop() is self._loop:
            return await self._fetch(partition_id, transaction_id)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._fetch(partition_id, transaction_id), self._loop)
        )

    async def _fetch(self, partition_id: int, transaction_id: int) -> bytes:
        partition = self._partitions[partition_id]
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self._timeout),
                wait=wait_exponential(multiplier=0.05, max=2.0),
                retry=retry_if_exception_type(_TransientDataError),
            ):
                with attempt:
                    return await self._fetch_once(partition, transaction_id)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            raise TransactionDataError(
                f"data not fetched within {self._timeout:g}s (client.transactionDataTimeout): {cause}",
                partition_id,
                transaction_id,
            ) from cause
        raise AssertionError("unreachable")  # pragma: no cover

    async def _fetch_once(self, partition: ClientPartition, transaction_id: int) -> bytes:
        self._check_open()
        endpoint = partition.endpoint
        if endpoint is None:
            raise _TransientDataError("the partition has no server right now")
        try:
            connection = await self._pool.get(endpoint)
            req_id = ReqId(
                self._client_id, partition.generation, partition.partition_id, self._next_seq_num()
            )
            response = await connection.get_transaction_data(
                client_pb2.TransactionDataRequest(req_id=req_id.to_proto(), transaction_id=transaction_id),
                REQUEST_TIMEOUT,
            )
        except (ConnectionError, grpc.aio.AioRpcError) as exc:
            raise _TransientDataError(f"{endpoint}: {exc}") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled (the client closes)
            # The connection closed under the call (its channel went with it): try again.
            raise _TransientDataError(f"{endpoint}: the connection closed during the call") from None
        if not response.success:
            raise _TransientDataError(f"{endpoint} could not read it: {response.error_message}")
        if crc32(response.data) != response.checksum:
            raise _TransientDataError(
                f"{endpoint} sent data of CRC-32 {crc32(response.data):#010x}, "
                f"expected {response.checksum:#010x}"
            )
        return bytes(response.data)
