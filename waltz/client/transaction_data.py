"""Fetching the data of committed transactions: the ``GetTransactionDataRange`` RPC, retried.

Source: docs/design/client.md "Appends, the feed and flush"; docs/design/server.md "Transaction data
cache"; ``docs/protocol.md`` "Transaction data". Where upstream Waltz asks for one transaction per
call, the client asks for a run of consecutive transactions (an apply batch, a reader's page) and
the server answers with as many as fit in one response, so a reader costs one call per page instead
of one per transaction. The request goes to the server that owns the partition now (it may move
while we retry); each transaction's data is checked against its CRC-32. Transient failures (no
owner, a connection lost under the call, the server not ready, a bad checksum, a malformed answer)
are retried with exponential backoff (tenacity) until ``client.transactionDataTimeout``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping

import grpc
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential

from waltz.client.client_partition import ClientPartition
from waltz.client.connection_pool import ConnectionPool
from waltz.errors import ClientClosedError, TransactionDataError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId, crc32

__all__ = ["REQUEST_TIMEOUT", "MalformedDataResponseError", "TransactionDataClient", "check_range_response"]

#: Seconds one GetTransactionDataRange call may take before it is tried again.
REQUEST_TIMEOUT = 5.0


class _TransientDataError(Exception):
    """A GetTransactionDataRange attempt failed in a way worth retrying."""


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
        return self.fetch_many(partition_id, [transaction_id])[0]

    def fetch_many(self, partition_id: int, transaction_ids: list[int]) -> list[bytes]:
        """Fetch several transactions' data, blocking (not on the client's event loop).

        Consecutive IDs are asked for in one call per response's worth; separate runs of them are
        fetched concurrently. The apply worker uses it to load a whole apply batch at once.

        Args:
            partition_id: the partition.
            transaction_ids: committed transaction IDs, in increasing order.

        Returns:
            The data of each transaction, in the order of ``transaction_ids``.

        Raises:
            TransactionDataError: one of them was not fetched within ``client.transactionDataTimeout``.
            ClientClosedError: the client closed.
            RuntimeError: called on the client's event loop thread.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("Transaction.get_data blocks: use get_data_async on the client's event loop")
        self._check_open()
        future = asyncio.run_coroutine_threadsafe(self._fetch_ids(partition_id, transaction_ids), self._loop)
        try:
            # The fetch keeps its own deadline; this wait only covers a loop that stopped answering.
            return future.result(self._timeout + REQUEST_TIMEOUT + 10)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._check_open()
            raise TransactionDataError(
                f"data not fetched within {self._timeout:g}s (client.transactionDataTimeout): the "
                "client's event loop did not answer",
                partition_id,
                transaction_ids[0],
            ) from None

    async def fetch_async(self, partition_id: int, transaction_id: int) -> bytes:
        """As :meth:`fetch`, from any event loop."""
        self._check_open()
        if asyncio.get_running_loop() is self._loop:
            return (await self._fetch_range(partition_id, transaction_id, 1))[0]
        return (
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(
                    self._fetch_range(partition_id, transaction_id, 1), self._loop
                )
            )
        )[0]

    async def _fetch_ids(self, partition_id: int, transaction_ids: list[int]) -> list[bytes]:
        deadline = asyncio.get_running_loop().time() + self._timeout  # one for every run and page
        runs: list[tuple[int, int]] = []  # (first ID, count) of each run of consecutive IDs
        for transaction_id in transaction_ids:
            if runs and runs[-1][0] + runs[-1][1] == transaction_id:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((transaction_id, 1))
        if len(runs) == 1:
            return await self._fetch_range(partition_id, *runs[0], deadline)
        fetched = await asyncio.gather(
            *(self._fetch_range(partition_id, first, n, deadline) for first, n in runs)
        )
        return [data for run in fetched for data in run]

    async def _fetch_range(
        self, partition_id: int, first: int, count: int, deadline: float | None = None
    ) -> list[bytes]:
        """The data of ``count`` consecutive transactions from ``first``, in as many calls as needed,
        retrying until ``deadline`` (loop time; default ``client.transactionDataTimeout`` from now)."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self._timeout
        partition = self._partitions[partition_id]
        found: list[bytes] = []
        while len(found) < count:
            next_id = first + len(found)
            try:
                async for attempt in AsyncRetrying(
                    # Every page tries at least once; retries stop at the fetch's deadline.
                    stop=stop_after_delay(max(0.0, deadline - loop.time())),
                    wait=wait_exponential(multiplier=0.05, max=2.0),
                    retry=retry_if_exception_type(_TransientDataError),
                ):
                    with attempt:
                        page = await self._fetch_once(partition, next_id, count - len(found))
            except RetryError as exc:
                cause = exc.last_attempt.exception()
                raise TransactionDataError(
                    f"data not fetched within {self._timeout:g}s (client.transactionDataTimeout): {cause}",
                    partition_id,
                    next_id,
                ) from cause
            found.extend(page)
        return found

    async def _fetch_once(self, partition: ClientPartition, first: int, count: int) -> list[bytes]:
        self._check_open()
        endpoint = partition.endpoint
        if endpoint is None:
            raise _TransientDataError("the partition has no server right now")
        try:
            connection = await self._pool.get(endpoint)
            req_id = ReqId(
                self._client_id, partition.generation, partition.partition_id, self._next_seq_num()
            )
            response = await connection.get_transaction_data_range(
                client_pb2.TransactionDataRangeRequest(
                    req_id=req_id.to_proto(), first_transaction_id=first, count=count
                ),
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
        return check_range_response(endpoint, response, first, count)


class MalformedDataResponseError(_TransientDataError):
    """A ``GetTransactionDataRange`` answer that does not answer the request (or fails a CRC)."""


def check_range_response(
    endpoint: str, response: client_pb2.TransactionDataRangeResponse, first: int, count: int
) -> list[bytes]:
    """The data of a ``GetTransactionDataRange`` answer, checked against the request.

    Args:
        endpoint: the server that answered (for messages).
        response: its answer.
        first: the first transaction ID asked for.
        count: how many were asked for.

    Returns:
        The data of transactions ``first``, ``first + 1``, ... (between 1 and ``count`` of them).

    Raises:
        _TransientDataError: the server could not answer (``success`` false).
        MalformedDataResponseError: the answer starts at another ID, holds no data or more than
            asked, data and checksums of different lengths, or data failing its CRC-32; the message
            names the server and the transaction.
    """
    if not response.success:
        raise _TransientDataError(f"{endpoint} could not read transaction {first}: {response.error_message}")
    datas, checksums = response.data, response.checksums
    if response.first_transaction_id != first or not 0 < len(datas) <= count or len(checksums) != len(datas):
        raise MalformedDataResponseError(
            f"{endpoint} answered a request for {count} transaction(s) from {first} with "
            f"{len(datas)} data and {len(checksums)} checksum(s) from {response.first_transaction_id}"
        )
    page = []
    for offset, (data, checksum) in enumerate(zip(datas, checksums, strict=True)):
        if crc32(data) != checksum:
            raise MalformedDataResponseError(
                f"{endpoint} sent data of transaction {first + offset} with CRC-32 "
                f"{crc32(data):#010x}, expected {checksum:#010x}"
            )
        page.append(bytes(data))
    return page
