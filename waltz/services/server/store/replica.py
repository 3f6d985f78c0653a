"""Replica connections: the replica session of one partition on one storage node.

Design: docs/design/server.md "Store partition" (replica sessions), "Quorum writes and batching"
(shared streams); docs/design/storage.md "Storage requests" (the open request opens a connection
to a storage node; every other request names its partition and store session). A server carries
the replica sessions of all its partitions on one stream per storage node
(:class:`StorageStreams`), so that one stream message takes appends of many partitions: a
stream's messages, not its records, are what costs CPU on both sides. Errors of any kind
(connection lost, timeout, failure response, an answer that breaks the protocol) become
:class:`ReplicaError`, after which the replica leaves the store session, except one: a read below
the replica's local start raises :class:`~waltz.errors.RecordsArchivedError`, with that local
start, since it is no failure of the replica (docs/design/archive.md, "Reads below the local
start"); a copy across such a gap resets the target to start there
(:meth:`ReplicaConnection.skip_gap`). What a storage node answers is checked before it is used:
the body answers the request, marks are -1 or more, and records read are the ones asked for
(contiguous from the first ID asked, no more than asked, each with its data CRC-32 right), so a
broken or lying node costs a replica, never a wrong record in the feed or in a catch-up copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from waltz.errors import ProtocolError, RecordsArchivedError, StorageRpcError, WaltzError
from waltz.protocol import storage_pb2
from waltz.protocol.records import Record
from waltz.protocol.storage_client import StorageSessionClient, check_response
from waltz.services.server.store.config import StoreConfig

__all__ = ["ReplicaConnection", "ReplicaError", "StorageStreams"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReplicaError(WaltzError):
    """A replica session failed: the storage node is unreachable, timed out or refused.

    Attributes:
        storage: the storage node's connect string.
        partition_id: the partition of the replica.
        code: the storage failure code (e.g. ``"SESSION_FENCED"``), ``"UNAVAILABLE"``, or
            ``"BAD_RESPONSE"`` (the node's answer broke the protocol).
    """

    def __init__(self, storage: str, partition_id: int, code: str, message: str) -> None:
        super().__init__(f"replica of partition {partition_id} on {storage}: {code}: {message}")
        self.storage = storage
        self.partition_id = partition_id
        self.code = code


class _SharedStream:
    """A store session stream to one storage node and the replica connections that use it."""

    __slots__ = ("client", "discarded", "opening", "refs")

    def __init__(self, client: StorageSessionClient) -> None:
        self.client = client
        self.opening: asyncio.Future[None] | None = None
        self.refs = 0
        self.discarded = False


class StorageStreams:
    """A server's store session streams: one per storage node, shared by every partition.

    Each replica connection takes the node's stream when it opens (:meth:`acquire`, which starts
    the stream and sends the open request when there is none yet) and gives it back when it
    closes (:meth:`release`). A stream that failed or timed out is discarded: the next replica
    connection to that node opens a new one, and the old one closes when its last user is gone.

    Args:
        cluster_key: the cluster key for the open requests.
        num_partitions: the cluster's number of partitions.
        config: timeouts and TLS.
    """

    def __init__(self, cluster_key: str, num_partitions: int, config: StoreConfig) -> None:
        self._cluster_key = cluster_key
        self._num_partitions = num_partitions
        self._config = config
        self._streams: dict[str, _SharedStream] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def open_streams(self) -> int:
        """Storage nodes with a stream in the pool (for tests and metrics)."""
        return len(self._streams)

    def failure_listeners(self, storage: str) -> int:
        """Replica connections listening for the failure of the pool's stream to ``storage``
        (0: none, or no stream; for tests and metrics)."""
        shared = self._streams.get(storage)
        return 0 if shared is None else shared.client.failure_listeners

    async def acquire(self, storage: str) -> _SharedStream:
        """The open stream to ``storage``, opened first if need be.

        Raises:
            StorageRpcError: the node refused the open request (e.g. ``CLUSTER_KEY_MISMATCH``).
            ConnectionError: the node is unreachable, or the pool is closed.
        """
        if self._closed:
            raise ConnectionError("the server's storage streams are closed")
        shared = self._streams.get(storage)
        if shared is None or shared.discarded or shared.client.broken:
            if shared is not None:
                self.discard(shared, "it broke")
            log.info("opening the store session stream to storage node %s", storage)
            shared = _SharedStream(
                StorageSessionClient(
                    storage, self._cluster_key, self._num_partitions, -1, tls=self._config.tls
                )
            )
            shared.opening = asyncio.ensure_future(shared.client.open())
            self._streams[storage] = shared
        shared.refs += 1
        assert shared.opening is not None
        try:
            # Shielded: one waiter giving up does not cancel the open request the others wait for.
            await asyncio.shield(shared.opening)
        except BaseException as exc:
            self.discard(shared, f"its open request failed: {type(exc).__name__}: {exc}")
            self.release(shared)
            raise
        return shared

    def discard(self, shared: _SharedStream, reason: str) -> None:
        """Stop handing out ``shared`` (it failed or timed out); it closes with its last user."""
        shared.discarded = True
        if self._streams.get(shared.client.address) is shared:
            del self._streams[shared.client.address]
            log.info(
                "store session stream to storage node %s dropped (%s); the next replica connection "
                "opens a new one",
                shared.client.address,
                reason,
            )

    def release(self, shared: _SharedStream) -> None:
        """Give a stream back; a discarded one closes once no replica connection uses it."""
        shared.refs -= 1
        if shared.refs <= 0 and (shared.discarded or self._closed):
            self._close_later(shared)

    def _close_later(self, shared: _SharedStream) -> None:
        if shared.opening is not None and not shared.opening.done():
            shared.opening.cancel()
        task = asyncio.ensure_future(shared.client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every stream (their users get ``ConnectionError``). Idempotent."""
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        for shared in streams:
            shared.discarded = True
            self._close_later(shared)
        if self._closing:
            await asyncio.wait(set(self._closing))


class ReplicaConnection:
    """The replica session of one partition on one storage node, under one store session ID.

    Args:
        storage: the storage node's connect string (``host:port`` of its storage port).
        partition_id: the partition.
        session_id: the store session ID sent with every request (fences older sessions).
        cluster_key: the cluster key for the open request.
        num_partitions: the cluster's number of partitions.
        config: timeouts and TLS.
        streams: the server's shared streams, one per storage node; None: a stream of its own.
    """

    def __init__(
        self,
        storage: str,
        partition_id: int,
        session_id: int,
        cluster_key: str,
        num_partitions: int,
        config: StoreConfig,
        streams: StorageStreams | None = None,
    ) -> None:
        self.storage = storage
        self.partition_id = partition_id
        self.session_id = session_id
        self._config = config
        self._streams = streams
        self._shared: _SharedStream | None = None
        # A stream of its own (no shared streams), else the borrowed one of _shared once open.
        self._own = (
            StorageSessionClient(storage, cluster_key, num_partitions, session_id, tls=config.tls)
            if streams is None
            else None
        )
        self._closed = False
        self._unlisten: list[Callable[[], None]] = []

    def on_failure(self, listener: Callable[[ReplicaError], None]) -> None:
        """Call ``listener(error)`` once when this connection's stream fails (the storage node
        stopped, restarted or closed it), as a :class:`ReplicaError` with the code
        ``UNAVAILABLE``; soon, on the event loop, when it failed already (check :attr:`broken`
        first to act at once). A shared stream tells every replica connection on it. Removed when
        the connection closes; a connection closed already is never told.

        Raises:
            ConnectionError: a connection on a shared stream that is not open yet.
        """
        if self._closed:
            return

        def failed(exc: BaseException) -> None:  # close() removes it first: never after a close
            listener(
                ReplicaError(self.storage, self.partition_id, "UNAVAILABLE", str(exc) or type(exc).__name__)
            )

        self._unlisten.append(self._session.on_failure(failed))

    @property
    def broken(self) -> bool:
        """True once the connection's stream failed or was closed, or the connection closed
        (every request then raises :class:`ReplicaError`)."""
        if self._closed:
            return True
        try:
            return self._session.broken
        except ConnectionError:  # a shared stream not taken yet
            return True

    async def _on_stream(self, call: Callable[[StorageSessionClient], Awaitable[T]]) -> T:
        """Await ``call`` on the stream client (``ConnectionError`` when not open, or closed)."""
        return await call(self._session)

    @property
    def _session(self) -> StorageSessionClient:
        """The stream client (raises ``ConnectionError`` before :meth:`open`, or after close)."""
        if self._own is not None:
            return self._own
        if self._shared is None:
            raise ConnectionError(f"the replica connection to {self.storage} is not open")
        return self._shared.client

    async def _guard(self, call: Awaitable[T], timeout: float | None = None) -> T:
        try:
            return await asyncio.wait_for(call, timeout or self._config.request_timeout)
        except RecordsArchivedError:
            raise  # an answer about the records, not a failure of the replica
        except StorageRpcError as exc:
            raise ReplicaError(self.storage, self.partition_id, exc.code, exc.remote_message) from exc
        except ProtocolError as exc:
            raise ReplicaError(self.storage, self.partition_id, "BAD_RESPONSE", str(exc)) from exc
        except (ConnectionError, TimeoutError, OSError) as exc:
            if self._shared is not None and self._streams is not None:
                # The node's stream may be dead or stuck: the next connection opens a new one.
                self._streams.discard(
                    self._shared, f"partition {self.partition_id}: {type(exc).__name__}: {exc}"
                )
            raise ReplicaError(
                self.storage, self.partition_id, "UNAVAILABLE", str(exc) or type(exc).__name__
            ) from exc

    async def open(self) -> None:
        """Open the stream (open request with the cluster key), then the replica session: an
        open-session request raises the partition's fence on the node to this session, so that
        no older session writes there before this one reads the replica's state
        (docs/design/storage.md "Fencing by store session ID"; reads never move a fence).

        Raises:
            ReplicaError: the node is unreachable or refused the open request, or refused the
                session (``SESSION_FENCED``: a newer session owns the partition;
                ``SESSION_JUMP_TOO_LARGE``: the node's fence is far below this session).
        """
        if self._own is not None:
            await self._guard(self._own.open(), self._config.connect_timeout)
        else:
            if self._closed or self._shared is not None or self._streams is None:
                raise ReplicaError(self.storage, self.partition_id, "UNAVAILABLE", "opened twice, or closed")
            acquiring = self._streams.acquire(self.storage)
            self._shared = await self._guard(acquiring, self._config.connect_timeout)
        await self._guard(
            self._on_stream(lambda c: c.open_session(self.partition_id, session_id=self.session_id))
        )

    async def close(self) -> None:
        """Close the stream (give the shared stream back). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for unlisten in self._unlisten:
            unlisten()
        self._unlisten.clear()
        if self._own is not None:
            await self._own.close()
        elif self._shared is not None and self._streams is not None:
            shared, self._shared = self._shared, None
            self._streams.release(shared)

    async def last_session_info(self) -> tuple[int, int]:
        """``(session ID, low-water mark)`` of the last session that set the low-water mark.

        Raises:
            ReplicaError: as any request, and ``BAD_RESPONSE`` for a value below -1.
        """
        session_id, low_water_mark = await self._guard(
            self._on_stream(lambda c: c.last_session_info(self.partition_id, session_id=self.session_id))
        )
        if session_id < -1 or low_water_mark < -1:
            raise self._bad_response(
                f"last session info: session {session_id}, low-water mark {low_water_mark} "
                "(both must be >= -1)"
            )
        return session_id, low_water_mark

    async def max_transaction_id(self) -> int:
        """The highest transaction ID stored on the replica (may be uncommitted; -1: none).

        Raises:
            ReplicaError: as any request, and ``BAD_RESPONSE`` for a value below -1.
        """
        transaction_id = await self._guard(
            self._on_stream(lambda c: c.max_transaction_id(self.partition_id, session_id=self.session_id))
        )
        if transaction_id < -1:
            raise self._bad_response(f"max transaction ID {transaction_id} (must be >= -1)")
        return transaction_id

    def _bad_response(self, what: str) -> ReplicaError:
        return ReplicaError(self.storage, self.partition_id, "BAD_RESPONSE", what)

    async def truncate(self, transaction_id: int) -> int:
        """Remove records after ``transaction_id``; returns the replica's new max transaction ID."""
        await self._guard(
            self._on_stream(
                lambda c: c.truncate(self.partition_id, transaction_id, session_id=self.session_id)
            )
        )
        return await self.max_transaction_id()

    async def reset_start(self, first_transaction_id: int) -> int:
        """Discard the replica's records and start its log at ``first_transaction_id``
        (docs/design/archive.md, "Reads below the local start").

        Returns:
            The replica's new max transaction ID (``first_transaction_id - 1``).

        Raises:
            ReplicaError: as any request (``INVALID_REQUEST`` when ``first_transaction_id`` is
                not above its max + 1), and ``BAD_RESPONSE`` when its max is not then
                ``first_transaction_id - 1``.
        """
        await self._guard(
            self._on_stream(
                lambda c: c.reset_start(self.partition_id, first_transaction_id, session_id=self.session_id)
            )
        )
        transaction_id = await self.max_transaction_id()
        if transaction_id != first_transaction_id - 1:
            raise self._bad_response(
                f"max transaction ID {transaction_id} after a reset start at {first_transaction_id}"
            )
        return transaction_id

    async def skip_gap(self, source: ReplicaConnection, next_id: int, gap: RecordsArchivedError) -> int:
        """Start this replica's log after a gap it cannot copy from ``source``.

        ``source`` answered a read of ``next_id`` with ``gap``: it holds nothing below its local
        start, and every transaction below that is committed and archived. This replica (which
        holds everything up to ``next_id - 1``) is reset to start at that local start
        (docs/design/archive.md, "Reads below the local start").

        Returns:
            The next transaction ID to copy: the source's local start.

        Raises:
            ReplicaError: the reset failed, or ``BAD_RESPONSE`` when the source's local start is
                not above ``next_id`` (it said it holds ``next_id``).
        """
        if gap.local_start <= next_id:
            raise ReplicaError(
                source.storage,
                self.partition_id,
                "BAD_RESPONSE",
                f"RECORDS_ARCHIVED for transaction {next_id} with the local start {gap.local_start}",
            )
        log.info(
            "partition %d: %s holds nothing below transaction %d (archived); the replica on %s, at "
            "transaction %d, starts its log there",
            self.partition_id,
            source.storage,
            gap.local_start,
            self.storage,
            next_id - 1,
        )
        await self.reset_start(gap.local_start)
        return gap.local_start

    async def set_low_water_mark(self, low_water_mark: int) -> None:
        """Record this session's low-water mark on the replica."""
        await self._guard(
            self._on_stream(
                lambda c: c.set_low_water_mark(self.partition_id, low_water_mark, session_id=self.session_id)
            )
        )

    async def append(self, records: Sequence[Record]) -> None:
        """Append records; returns once the storage node has flushed them."""
        await self._guard(
            self._on_stream(lambda c: c.append(self.partition_id, records, session_id=self.session_id))
        )

    def start_append(self, append: bytes) -> Awaitable[None]:
        """Send a serialized ``AppendRequest`` now (in call order) and return its acknowledgement.

        The same bytes go to every replica (serialized once per batch). Awaiting the result raises
        :class:`ReplicaError` when the replica failed or did not answer in time.
        """
        try:
            future = self._session.submit_append(self.partition_id, append, session_id=self.session_id)
        except (ConnectionError, OSError) as exc:
            failed: asyncio.Future[storage_pb2.StorageResponse] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            future = failed

        async def acknowledged() -> None:
            check_response(await future, self.storage, "append")

        return self._guard(acknowledged())

    async def records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Read up to ``max_records`` records from ``transaction_id`` on.

        Returns:
            Records ``transaction_id, transaction_id + 1, ...`` (at most ``max_records``; none when
            ``transaction_id`` is above the replica's max), each with its data CRC-32 verified.

        Raises:
            RecordsArchivedError: ``transaction_id`` is below the replica's local start.
            ReplicaError: as any request, and ``BAD_RESPONSE`` when the answer holds more records
                than asked, a record out of sequence, or a record whose data fails its CRC-32.
        """
        records = await self._guard(
            self._on_stream(
                lambda c: c.records(
                    self.partition_id, transaction_id, max_records, session_id=self.session_id
                )
            )
        )
        if len(records) > max(1, max_records):
            raise self._bad_response(f"{len(records)} records answer a read of at most {max_records}")
        expected = transaction_id
        for record in records:
            if record.transaction_id != expected:
                raise self._bad_response(
                    f"record {record.transaction_id} where the read from {transaction_id} expected {expected}"
                )
            if not record.checksum_ok():
                raise self._bad_response(f"record {expected} has data that does not match its CRC-32")
            expected += 1
        return records

    async def copy_from(self, source: ReplicaConnection, first: int, last: int, page: int) -> int:
        """Copy records ``first..last`` from ``source`` to this replica (catch-up).

        When ``source`` no longer holds the next records (they are archived: below its local
        start), this replica is reset to start at that local start, and the copy goes on from there
        (:meth:`skip_gap`).

        Returns:
            The last transaction ID this replica holds of the range (``first - 1`` when nothing
            was copied).

        Raises:
            ReplicaError: either side failed, or the source does not hold the records.
        """
        next_id = first
        while next_id <= last:
            try:
                batch = await source.records(next_id, min(page, last - next_id + 1))
            except RecordsArchivedError as gap:
                next_id = await self.skip_gap(source, next_id, gap)
                continue
            if not batch or batch[0].transaction_id != next_id:
                raise ReplicaError(
                    source.storage,
                    self.partition_id,
                    "MISSING",
                    f"no record {next_id} to copy to {self.storage}",
                )
            await self.append(batch)
            next_id = batch[-1].transaction_id + 1
        if last >= first:
            log.info(
                "partition %d: copied transactions %d..%d from %s to %s",
                self.partition_id,
                first,
                last,
                source.storage,
                self.storage,
            )
        return next_id - 1
