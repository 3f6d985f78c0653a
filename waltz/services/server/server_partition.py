"""The partition object of a server: appends checked against the lock table, the feed, mounts.

Design: docs/design/server.md "The partition object", "Appends and the lock check", "Mount and
feed"; docs/design/locks.md "Optimistic locking in Waltz", "How a lock failure is decided and
reported"; ``docs/protocol.md`` (the contract with the client). One :class:`Partition` wraps the
partition's :class:`~waltz.services.server.store.store_partition.StorePartition` and serves every client
connection that mounted it. Everything runs on the server's event loop, so the lock check, the
pending-lock bookkeeping and the feed see one consistent order.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from waltz import tracing
from waltz.errors import ArchivedReadError, RecordsArchivedError, WaltzError
from waltz.metadata.epochs import PartitionEpochs
from waltz.metadata.zk import Versioned
from waltz.protocol import client_pb2, common_pb2
from waltz.protocol.records import Record, ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER
from waltz.services.server.appends import AppendRow
from waltz.services.server.archived_reads import ArchivedReads
from waltz.services.server.epoch_gate import EpochGate, epoch_gate
from waltz.services.server.lock_table import DEFAULT_HASH_COUNT, DEFAULT_SIZE, LockTable, PendingLocks
from waltz.services.server.split_barrier import BarrierDue, barrier_due, is_barrier_of
from waltz.services.server.split_genesis import (
    GenesisDue,
    GenesisStep,
    genesis_due,
    genesis_step,
    is_genesis_of,
)
from waltz.services.server.store.append_queue import AppendFailedError
from waltz.services.server.store.store_partition import StorePartition

__all__ = ["ClientConnection", "Partition", "PartitionConfig"]

log = logging.getLogger(__name__)

#: Seconds between attempts to read ``partitions/epochs`` when opening a partition fails (the
#: partition takes no append until it has read it: docs/design/splits.md "The handover", step 3).
EPOCHS_RETRY_DELAY = 0.5
#: Records read per request while an opening partition looks for its barrier above ``H(p)``.
BARRIER_SCAN_PAGE = 1000


#: A run of feed entries in columns: client IDs, generations, sequence numbers, headers.
FeedColumns = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]
#: A feed entry as the feed cache keeps it: transaction ID, ReqId, header.
FeedEntry = tuple[int, ReqId, int]


def feed_columns(entries: Sequence[FeedEntry]) -> FeedColumns:
    """The columns of a ``FeedEntries`` message for ``entries``."""
    return (
        [req_id.client_id for _, req_id, _ in entries],
        [req_id.generation for _, req_id, _ in entries],
        [req_id.seq_num for _, req_id, _ in entries],
        [header for _, _, header in entries],
    )


class ClientConnection(Protocol):
    """What a partition needs of a client's stream (implemented by the client service)."""

    client_id: int
    connection_id: int

    def send(self, message: client_pb2.ServerMessage) -> None:
        """Queue a message for the client (never blocks)."""

    def send_feed(self, partition_id: int, first_transaction_id: int, columns: FeedColumns) -> None:
        """Queue a ``FeedEntries`` message for the client (never blocks): the consecutive
        transactions from ``first_transaction_id`` on, one per element of the columns."""

    def backlog(self) -> int:
        """Protocol messages queued and not yet written to the stream (each feed entry counted)."""


#: Most transactions one ``GetTransactionDataRange`` call returns.
DATA_RANGE_MAX_COUNT = 10_000
#: Data bytes one ``GetTransactionDataRange`` answer holds at most (a single larger transaction
#: is still returned alone); well under the channels' 32 MiB message limit.
DATA_RANGE_MAX_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """Settings of the partition objects (``server.*`` keys).

    Attributes:
        lock_table_size: slots of the lock table (``server.optimisticLockTableSize``).
        lock_table_hash_count: slots per lock (``server.optimisticLockTableHashCount``).
        feed_cache_size: recent feed entries kept in memory (``server.feedCacheSize``).
        transaction_data_cache_size: recent transaction data kept in memory
            (``server.transactionDataCacheSize``, in transactions).
        transaction_data_cache_bytes: at most this many bytes of it
            (``server.transactionDataCacheBytes``).
        feed_page: transactions read from storage per request for far-behind clients.
        max_backlog: protocol messages (each feed entry counted) queued for one connection before
            its feed falls back to catch-up.
        max_pending: records queued in the store before appends wait (back pressure).
        max_pending_bytes: bytes of their data queued before appends wait (one append always
            goes when less is queued, however large).
    """

    lock_table_size: int = DEFAULT_SIZE
    lock_table_hash_count: int = DEFAULT_HASH_COUNT
    feed_cache_size: int = 100_000
    transaction_data_cache_size: int = 10_000
    transaction_data_cache_bytes: int = 64 << 20
    feed_page: int = 1000
    max_backlog: int = 20_000
    max_pending: int = 20_000
    max_pending_bytes: int = 256 << 20


class TransactionDataCache:
    """The data and checksums of a partition's most recent transactions, bounded by count and by
    bytes (the oldest leave first; one transaction larger than the byte budget is not kept).

    A run of consecutive transaction IDs in a deque (commits come in ID order; an ID that does not
    follow the run starts a new one): a put is an append, a get an index.

    Args:
        max_transactions: transactions kept at most.
        max_bytes: bytes of data kept at most.
    """

    def __init__(self, max_transactions: int, max_bytes: int) -> None:
        self.max_transactions = max_transactions
        self.max_bytes = max_bytes
        self.bytes = 0
        """Bytes of data held now."""
        self._first = 0  # transaction ID of _entries[0]
        self._entries: deque[tuple[bytes, int]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, transaction_id: int) -> tuple[bytes, int] | None:
        """``(data, checksum)`` of a cached transaction, or None."""
        index = transaction_id - self._first
        entries = self._entries
        return entries[index] if 0 <= index < len(entries) else None

    def put(self, transaction_id: int, data: bytes, checksum: int) -> None:
        """Keep a newly committed transaction (IDs come in increasing order)."""
        entries = self._entries
        if transaction_id != self._first + len(entries):  # not the next one: a new run
            entries.clear()
            self.bytes = 0
            self._first = transaction_id
        entries.append((data, checksum))
        self.bytes += len(data)
        while len(entries) > self.max_transactions or self.bytes > self.max_bytes:
            evicted, _ = entries.popleft()
            self._first += 1
            self.bytes -= len(evicted)


@dataclass(slots=True)
class _Cursor:
    """A mounted connection's position in the feed."""

    connection: ClientConnection
    mount: client_pb2.MountRequest
    next_id: int
    realtime: bool = False
    task: asyncio.Task[None] | None = None
    answered: bool = False  # the mount response was sent
    parked: bool = False  # stopped at the end of the client's feed window, waiting for a FeedWindow


@dataclass(slots=True)
class _ClientState:
    """What a partition keeps of one client ID: the network sequence number of its latest mount,
    its appends unresolved, and the open connections it came on (docs/design/server.md, "Bounds
    on what a peer costs"): the state goes once it has neither connections nor appends."""

    client_id: int
    network_seq: int = -1
    pending: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    connections: set[int] = field(default_factory=set)


class _InFlight:
    """An append in the store, not yet resolved: the lock table slots it holds pending, the lock
    failures that wait to name its transaction (``_defer_lock_failure``), and its own connection
    and ReqId (refused there when a recovery of the store drops it)."""

    __slots__ = (
        "connection",
        "hashes",
        "partition",
        "received",
        "req_id",
        "slots",
        "span",
        "state",
        "waiters",
    )

    def __init__(
        self,
        partition: Partition,
        state: _ClientState,
        slots: Collection[int],
        hashes: Sequence[int],
        received: float,
        connection: ClientConnection,
        req_id: ReqId,
    ) -> None:
        self.partition = partition
        self.state = state
        self.slots = slots  # lock table slots of its WRITE and APPEND locks (raised on commit)
        self.hashes = hashes  # its WRITE and APPEND lock hashes (held in flight until resolved)
        self.received = received
        self.connection = connection  # the append's own, told when a recovery dropped it
        self.req_id = req_id
        self.waiters: list[tuple[ClientConnection, ReqId]] | None = None
        self.span: Any = None  # its waltz.server.append span when traced (docs/tracing.md)

    def resolved(self, transaction_id: int, error: BaseException | None) -> None:
        self.partition._resolved(self, None if error is not None else transaction_id, error)


class Partition:
    """One partition owned by this server.

    Args:
        partition_id: the partition.
        generation: the generation under which this server owns it.
        store_factory: builds the store partition, given the commit callback.
        config: partition settings.
        observe_commits: takes the seconds from receiving each append to its commit, a commit's
            worth at a time (the ``waltz_server_commit_seconds`` histogram).
        archived: reads of the ranges below the replicas' local start, from the archive (None: a
            read below it fails with :class:`~waltz.errors.ArchivedReadError`).
        read_epochs: reads ``<root>/partitions/epochs`` afresh (with the server's watch on it), and
            hands the value to every partition's :meth:`epochs_changed`; awaited once after the
            recovery and before the first append (docs/design/splits.md "The handover", step 3).
            None: no epochs (every append is taken whatever its epoch), for a partition without a
            cluster around it.
        write_barrier: writes ``B(p)`` into ``<root>/partitions/epochs``, given the epoch, the
            parent and the barrier's transaction ID; handles its own errors (it never raises but
            cancelled). None: the barrier is appended and ``B(p)`` is not written.
        write_genesis: writes a new child's genesis ID into ``<root>/partitions/epochs``, given
            the epoch, the child and the genesis's transaction ID; handles its own errors as
            ``write_barrier``. None: the genesis is appended and its ID is not written.
    """

    def __init__(
        self,
        partition_id: int,
        generation: int,
        store_factory: Callable[[Callable[[list[Record]], None]], StorePartition],
        config: PartitionConfig | None = None,
        observe_commits: Callable[[Iterable[float]], None] | None = None,
        archived: ArchivedReads | None = None,
        read_epochs: Callable[[], Awaitable[object]] | None = None,
        write_barrier: Callable[[int, int, int], Awaitable[object]] | None = None,
        write_genesis: Callable[[int, int, int], Awaitable[object]] | None = None,
    ) -> None:
        self.partition_id = partition_id
        self._archived = archived
        # The highest local start a replica answered with: reads below it go to the archive at once.
        self._archived_below = 0
        self.archived_reads = 0
        self.generation = generation
        self.config = config or PartitionConfig()
        self.store = store_factory(self._committed)
        self.store.on_close = self._store_closing
        self._observe_commits = observe_commits
        # perf_counter() at which each append of the commit being resolved arrived: timed at once
        # when the commit's records reach _committed (one clock read and one histogram lock).
        self._committed_received: list[float] = []
        self._lock_table: LockTable | None = None
        self._read_epochs = read_epochs
        self._opening: asyncio.Task[LockTable] | None = None  # recovery, then the epochs read
        # The epoch gate (docs/design/splits.md "The handover"): None takes every epoch. Worked out
        # when partitions/epochs changes, consulted by each append: no ZooKeeper read per append.
        self._epoch_gate: EpochGate | None = None
        self._epochs_version = -2  # the znode version the gate is from (-1: no znode; -2: none read)
        self._epochs: PartitionEpochs | None = None  # the value the gate is from
        # The barriers of this owner (docs/design/splits.md "The handover", step 3), by epoch: the
        # transaction ID of the barrier it appended or found in its recovered log, None while its
        # own is in the store. One per epoch: the log holds one barrier per epoch.
        self._barriers: dict[int, int | None] = {}
        self._write_barrier = write_barrier
        self._barrier_writes: dict[int, asyncio.Task[None]] = {}  # epoch -> its B(p) write
        # The genesis of this new child (docs/design/splits.md "The handover", step 4), by epoch:
        # the transaction ID of the genesis it appended or found at B(p) + 1.
        self._geneses: dict[int, int] = {}
        self._write_genesis = write_genesis
        self._genesis_writes: dict[int, asyncio.Task[None]] = {}  # epoch -> its genesis ID write
        self._genesis_task: asyncio.Task[None] | None = None  # an open partition's genesis
        self.epoch_refusals = 0
        self._pending_locks: PendingLocks[_InFlight] = PendingLocks()  # locks of unresolved appends
        self._feed: deque[FeedEntry] = deque(maxlen=self.config.feed_cache_size)
        self._data = TransactionDataCache(
            self.config.transaction_data_cache_size, self.config.transaction_data_cache_bytes
        )
        self._cursors: dict[int, _Cursor] = {}  # by connection ID
        # Connection ID -> the highest transaction ID its feed may reach (docs/protocol.md "Feed
        # window"); absent: no limit. Set by a mount when it arrives, raised by FeedWindow.
        self._windows: dict[int, int] = {}
        self._unmounts: dict[int, int] = {}  # connection ID -> unmounts received (cancels mounts under way)
        self._clients: dict[int, _ClientState] = {}
        self._connection_clients: dict[int, set[int]] = {}  # connection ID -> client IDs it came with
        self._capacity = asyncio.Event()
        self._capacity.set()
        self.appends = 0
        self.lock_failures = 0
        self.dropped = 0
        self.feed_cache_hits = 0
        self.feed_cache_misses = 0
        self.feed_windows = 0
        self.parked_feeds = 0
        self.refused_mounts = 0  # mounts above the high-water mark (CLIENT_AHEAD_OF_LOG)
        self.data_cache_hits = 0
        self.data_cache_misses = 0

    # ---- life cycle ----

    def start(self) -> None:
        """Start the store partition (recovery, then writing)."""
        self.store.start()

    async def close(self, reason: str) -> None:
        """Suspend every feed (clients mount elsewhere) and close the store partition."""
        self._store_closing(reason)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        await self.store.close(reason)

    def _store_closing(self, reason: str) -> None:
        """Suspend every feed: the store partition closes (the partition moved, the server stops,
        or a newer generation fenced the store).

        Called before the store settles the appends it still holds, and a closed partition answers
        no flush and no mount with "ready": the fate of an append in flight is undecided here, so a
        client must learn it from the feed of the partition's next owner, never from this server's
        old high-water mark (docs/design/server.md "Generations and server fencing").
        """
        if self._cursors:
            log.info("partition %d: suspending %d feed(s): %s", self.partition_id, len(self._cursors), reason)
        for cursor in list(self._cursors.values()):
            self._suspend(cursor)

    @property
    def closed(self) -> bool:
        """True once the store partition closed."""
        return self.store.closed

    @property
    def mounted_clients(self) -> int:
        """Client connections that receive this partition's feed."""
        return len(self._cursors)

    @property
    def client_states(self) -> int:
        """Client IDs this partition keeps state for (docs/design/server.md, "Bounds on what a
        peer costs"): those mounted on an open connection, and those with appends unresolved."""
        return len(self._clients)

    @property
    def high_water_mark(self) -> int:
        """The committed high-water mark."""
        return self.store.high_water_mark

    async def _ready(self) -> LockTable | None:
        """The lock table once the partition is open (recovered, epochs read); None when the
        partition closed first."""
        table = self._lock_table
        if table is not None:
            return table
        opening = self._begin_opening()
        try:
            # Shielded: an append that stops waiting (its connection closed) does not stop it.
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if opening.cancelled() and (current is None or not current.cancelling()):
                return None  # the partition closed while opening (close() cancels it)
            raise

    def _begin_opening(self) -> asyncio.Task[LockTable]:
        """The partition's opening (recovery, epochs, barrier, lock table), started on first need."""
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.get_running_loop().create_task(self._open())
            opening.add_done_callback(self._opened)
        return opening

    def _opened(self, opening: asyncio.Task[LockTable]) -> None:
        if not opening.cancelled() and (error := opening.exception()) is not None:
            log.error("partition %d: opening failed: %r", self.partition_id, error, exc_info=error)

    async def _open(self) -> LockTable:
        """Wait for the recovery, read the epochs, seal a sealing parent, append or find a new
        child's genesis, then make the lock table: appends go from then on."""
        await self.store.recovered.wait()
        if self._read_epochs is not None:
            await self._load_epochs()
            await self._seal_at_open()
            await self._genesis_at_open()
        # Every slot starts at the high-water mark, never below (docs/design/locks.md "The lock
        # table"): a new child's at B(p) + 1, its genesis. Nothing but a barrier or a genesis
        # appended since the recovery: no append passes before this.
        self._lock_table = LockTable(
            self.store.high_water_mark, self.config.lock_table_size, self.config.lock_table_hash_count
        )
        self._seal()  # a sealing mark the watch brought during the open: before the first append
        return self._lock_table

    async def _load_epochs(self) -> None:
        """Read ``partitions/epochs`` after the recovery and before the first append
        (docs/design/splits.md "The handover", step 3): a parent marked sealing refuses stale
        appends from its first append on. Tried again until it succeeds or the partition closes."""
        assert self._read_epochs is not None
        attempt = 0
        while not self.store.closed:
            attempt += 1
            try:
                await self._read_epochs()  # hands the value to epochs_changed
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == 1 or attempt % 20 == 0:  # a ZooKeeper away for long: a line per 10 s
                    log.warning(
                        "partition %d: cannot read partitions/epochs (attempt %d; appends wait): %s",
                        self.partition_id,
                        attempt,
                        exc,
                    )
            await asyncio.sleep(EPOCHS_RETRY_DELAY)

    def epochs_changed(self, epochs: Versioned[PartitionEpochs]) -> None:
        """Take the value of ``partitions/epochs`` (read after a change of it): the partition's
        epoch gate follows it (:func:`~waltz.services.server.epoch_gate.epoch_gate`). A value
        older than the one held is ignored.

        Called on the event loop between appends, so an append checked before the gate closes is
        ordered before every append it refuses (docs/design/splits.md "The handover", step 3).
        An open partition that now owes a barrier (a parent marked sealing, ``B(p)`` unknown)
        queues it in the same step, before any append checked later (docs/design/splits.md "The
        owner's barrier"); an opening one does it before its first append. A new child that owes
        its genesis opens (or, open already, appends it: its gate refuses every append until the
        genesis is in the znode).
        """
        if epochs.version < self._epochs_version:
            return
        self._epochs_version = epochs.version
        self._epochs = epochs.value
        gate = epoch_gate(epochs.value, self.partition_id)
        if gate != self._epoch_gate:
            log.info("partition %d: epoch gate %s", self.partition_id, gate)
        self._epoch_gate = gate
        if self._lock_table is not None:  # open (an opening partition seals in _open)
            self._seal()
            self._genesis_when_open()
        elif (
            self._read_epochs is not None
            and not self.store.closed
            and (
                barrier_due(epochs.value, self.partition_id) is not None
                or genesis_due(epochs.value, self.partition_id) is not None
            )
        ):
            # A sealing parent, or a new child, that no client has opened yet opens now: its
            # barrier (and B(p), which the split waits for) or its genesis (which its clients
            # wait for) does not wait for a client's mount or append.
            self._begin_opening()

    # ---- the barrier (docs/design/splits.md "The owner's barrier"; "The handover", step 3) ----

    def _seal(self) -> None:
        """Append the barrier the partition owes now, if any, as the next append of its order.

        Called on the event loop with no await since the gate was set: every append checked
        before is queued before the barrier, and the gate refuses every stale append after it. A
        barrier of the epoch this owner appended or found already is not appended again; if its
        ``B(p)`` is still not in the znode, it is written again (a write that gave up).
        """
        epochs = self._epochs
        if epochs is None or self.store.closed:
            return
        due = barrier_due(epochs, self.partition_id)
        if due is None:
            return  # no parent sealing here, or its B(p) is written: nothing is appended
        if due.epoch not in self._barriers:
            self._append_barrier(due)
            return
        transaction_id = self._barriers[due.epoch]
        if transaction_id is not None:
            self._write_barrier_id(due, transaction_id)

    def _append_barrier(self, due: BarrierDue, future: asyncio.Future[int] | None = None) -> None:
        """Queue the barrier ``due`` in the store (no locks, no back pressure: one record).

        When it commits, ``B(p)`` is written. When a recovery of the store dropped it
        (:class:`AppendFailedError`), it is appended again, unless ``future`` is given: then the
        future gets the transaction ID or the error, and its awaiter decides.
        """
        epoch = due.epoch
        self._barriers[epoch] = None
        data = due.barrier.encode()

        def done(transaction_id: int, error: BaseException | None) -> None:
            if error is None:
                self._barriers[epoch] = transaction_id
                log.info(
                    "partition %d: the barrier of epoch %d committed at %d",
                    self.partition_id,
                    epoch,
                    transaction_id,
                )
                self._write_barrier_id(due, transaction_id)
                if future is not None and not future.done():
                    future.set_result(transaction_id)
                return
            if epoch in self._barriers and self._barriers[epoch] is None:
                del self._barriers[epoch]
            if future is not None:
                if not future.done():
                    future.set_exception(error)
            elif isinstance(error, AppendFailedError) and not self.store.closed:
                log.warning(
                    "partition %d: the barrier of epoch %d was not committed (%s): appending it again",
                    self.partition_id,
                    epoch,
                    error,
                )
                asyncio.get_running_loop().call_soon(self._seal)
            else:
                log.info(
                    "partition %d: the barrier of epoch %d is undecided (%s): the next owner looks "
                    "for it in its recovered log",
                    self.partition_id,
                    epoch,
                    error,
                )

        log.info("partition %d: appending the barrier of epoch %d", self.partition_id, epoch)
        self.store.enqueue(due.req_id(self.generation), SPLIT_RECORD_HEADER, data, zlib.crc32(data), done)

    async def _seal_at_open(self) -> None:
        """Before the first append of a sealing parent: find the barrier of the epoch in the
        recovered log above ``H(p)``, or append one and wait for its commit; then write ``B(p)``
        (the first one's ID). Nothing when ``B(p)`` is in the znode already. Tried again until it
        succeeds or the partition closes (appends wait, as for the recovery)."""
        attempt = 0
        while not self.store.closed:
            epochs = self._epochs
            due = None if epochs is None else barrier_due(epochs, self.partition_id)
            if due is None or due.epoch in self._barriers:
                return
            attempt += 1
            try:
                found = await self._find_barrier(due)
                if found is not None:
                    log.info(
                        "partition %d: the recovered log holds the barrier of epoch %d at %d: none appended",
                        self.partition_id,
                        due.epoch,
                        found,
                    )
                    self._barriers[due.epoch] = found
                    self._write_barrier_id(due, found)
                    return
                committed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                self._append_barrier(due, committed)
                await committed
                return
            except asyncio.CancelledError:
                raise
            except (WaltzError, TimeoutError) as exc:
                if self.store.closed:
                    return
                log.warning(
                    "partition %d: cannot seal for epoch %d at open (attempt %d; appends wait): %s",
                    self.partition_id,
                    due.epoch,
                    attempt,
                    exc,
                )
            await asyncio.sleep(EPOCHS_RETRY_DELAY)

    async def _find_barrier(self, due: BarrierDue) -> int | None:
        """The transaction ID of the first barrier of ``due``'s epoch in the committed log above
        ``H(p)``, or None (read in pages of :data:`BARRIER_SCAN_PAGE`).

        Raises:
            ArchivedReadError: part of the range is archived and the archive cannot give it.
            StoreClosedError: the partition closed.
            TimeoutError: no replica answered a read.
            WaltzError: a read came back empty below the high-water mark.
        """
        next_id = due.high_water_mark + 1
        last = self.store.high_water_mark
        while next_id <= last:
            records = await self.read_records(next_id, min(BARRIER_SCAN_PAGE, last - next_id + 1))
            if not records:
                raise WaltzError(
                    f"partition {self.partition_id}: no record read at {next_id} (the log ends at {last})"
                )
            for record in records:
                if is_barrier_of(record, due):
                    return record.transaction_id
            next_id = records[-1].transaction_id + 1
        return None

    def _write_barrier_id(self, due: BarrierDue, transaction_id: int) -> None:
        """Write ``B(p)`` in the background (one write per epoch at a time)."""
        if self._write_barrier is None:
            return
        running = self._barrier_writes.get(due.epoch)
        if running is not None and not running.done():
            return
        self._barrier_writes[due.epoch] = asyncio.get_running_loop().create_task(
            self._write_barrier_logged(due, transaction_id)
        )

    async def _write_barrier_logged(self, due: BarrierDue, transaction_id: int) -> None:
        assert self._write_barrier is not None
        try:
            await self._write_barrier(due.epoch, due.parent, transaction_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "partition %d: writing B(p) = %d of epoch %d failed",
                self.partition_id,
                transaction_id,
                due.epoch,
            )

    # ---- the genesis (docs/design/splits.md "The handover", step 4) ----

    async def _genesis_at_open(self) -> None:
        """Before the first append of a new child that owes its genesis: append it at ``B(p) + 1``
        (a log recovered at ``B(p)``) or find it there (a log above: an earlier owner's), and wait
        for its commit; then write its ID into the znode in the background. Nothing when no
        genesis is owed. Tried again until it succeeds or the partition closes (appends wait, as
        for the recovery); a record at ``B(p) + 1`` that is not the genesis is logged as an error
        each time, and the partition takes no append."""
        attempt = 0
        while not self.store.closed:
            epochs = self._epochs
            due = None if epochs is None else genesis_due(epochs, self.partition_id)
            if due is None:
                return
            found = self._geneses.get(due.epoch)
            if found is not None:
                self._write_genesis_id(due, found)
                return
            attempt += 1
            try:
                transaction_id = await self._genesis(due)
            except asyncio.CancelledError:
                raise
            except (WaltzError, TimeoutError) as exc:
                if self.store.closed:
                    return
                if attempt == 1 or attempt % 20 == 0:
                    log.error(
                        "partition %d: cannot start with the genesis of epoch %d (attempt %d; appends "
                        "wait): %s",
                        self.partition_id,
                        due.epoch,
                        attempt,
                        exc,
                    )
                await asyncio.sleep(EPOCHS_RETRY_DELAY)
                continue
            self._geneses[due.epoch] = transaction_id
            self._write_genesis_id(due, transaction_id)
            return

    async def _genesis(self, due: GenesisDue) -> int:
        """Append the genesis ``due`` or find it at ``B(p) + 1``; its transaction ID once committed.

        Raises:
            WaltzError: the log is below ``B(p)``, the record at ``B(p) + 1`` is not the genesis,
                the genesis committed elsewhere than ``B(p) + 1``, or a read came back empty.
            AppendFailedError: a recovery of the store dropped the append (its high-water mark
                then says what the next attempt does).
            TimeoutError: no replica answered a read.
        """
        step = genesis_step(due, self.store.high_water_mark)
        if step is GenesisStep.FIND:
            records = await self.read_records(due.transaction_id, 1)
            if not records or not is_genesis_of(records[0], due):
                raise WaltzError(
                    f"partition {self.partition_id}: the record at {due.transaction_id} is not the "
                    f"genesis of epoch {due.epoch}: a new child's log starts with its genesis "
                    '(docs/design/splits.md, "The handover", step 4)'
                )
            log.info(
                "partition %d: the recovered log holds the genesis of epoch %d at %d: none appended",
                self.partition_id,
                due.epoch,
                due.transaction_id,
            )
            return due.transaction_id
        committed: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def done(transaction_id: int, error: BaseException | None) -> None:
            if committed.done():
                return
            if error is not None:
                committed.set_exception(error)
            else:
                committed.set_result(transaction_id)

        data = due.genesis.encode()
        log.info("partition %d: appending the genesis of epoch %d", self.partition_id, due.epoch)
        self.store.enqueue(due.req_id(self.generation), SPLIT_RECORD_HEADER, data, zlib.crc32(data), done)
        transaction_id = await committed
        if transaction_id != due.transaction_id:  # nothing is appended before it: a bug if so
            raise WaltzError(
                f"partition {self.partition_id}: the genesis of epoch {due.epoch} committed at "
                f"{transaction_id}, not at {due.transaction_id}"
            )
        log.info(
            "partition %d: the genesis of epoch %d committed at %d",
            self.partition_id,
            due.epoch,
            transaction_id,
        )
        return transaction_id

    def _genesis_when_open(self) -> None:
        """An open partition that owes a genesis (opened before the znode marked it opened, which
        the split does not do): append it in the background, then start the lock table again at
        ``B(p) + 1``. The gate refuses every append until the genesis is in the znode, so none is
        checked against the table before."""
        epochs = self._epochs
        if epochs is None or self.store.closed or genesis_due(epochs, self.partition_id) is None:
            return
        if self._genesis_task is not None and not self._genesis_task.done():
            return

        async def run() -> None:
            await self._genesis_at_open()
            table = self._lock_table
            if table is not None and not self.store.closed:
                self._lock_table = LockTable(
                    self.store.high_water_mark, self.config.lock_table_size, self.config.lock_table_hash_count
                )

        self._genesis_task = asyncio.get_running_loop().create_task(run())

    def _write_genesis_id(self, due: GenesisDue, transaction_id: int) -> None:
        """Write the genesis's ID in the background (one write per epoch at a time)."""
        if self._write_genesis is None:
            return
        running = self._genesis_writes.get(due.epoch)
        if running is not None and not running.done():
            return

        async def write() -> None:
            assert self._write_genesis is not None
            try:
                await self._write_genesis(due.epoch, due.child, transaction_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "partition %d: writing the genesis %d of epoch %d failed",
                    self.partition_id,
                    transaction_id,
                    due.epoch,
                )

        self._genesis_writes[due.epoch] = asyncio.get_running_loop().create_task(write())

    @property
    def epoch_gate(self) -> EpochGate | None:
        """The partition's epoch gate now (None: it takes every epoch)."""
        return self._epoch_gate

    def _client(self, client_id: int, connection: ClientConnection) -> _ClientState:
        """The state of a client ID, made on its first message; it stays while ``connection`` (or
        another open connection it came on) is open, or while it has appends unresolved."""
        state = self._clients.get(client_id)
        if state is None:
            state = self._clients[client_id] = _ClientState(client_id)
            state.idle.set()
        connection_id = connection.connection_id
        if connection_id not in state.connections:
            state.connections.add(connection_id)
            self._connection_clients.setdefault(connection_id, set()).add(client_id)
        return state

    def _forget_if_unused(self, state: _ClientState) -> None:
        """Drop a client's state once no open connection carries it and no append of it is unresolved."""
        if not state.connections and not state.pending and self._clients.get(state.client_id) is state:
            del self._clients[state.client_id]

    def _stale(self, connection: ClientConnection, req_id: common_pb2.ReqId, network_seq: int) -> bool:
        """Drop messages of another generation, or of an older connection of the same client."""
        return self._sender(connection, req_id, network_seq) is None

    def _sender(
        self, connection: ClientConnection, req_id: common_pb2.ReqId | ReqId, network_seq: int
    ) -> _ClientState | None:
        """The state of the client that sent a message, or None (counted as dropped) when the
        message is stale: of another generation, or of an older connection of that client."""
        if req_id.generation != self.generation:
            self.dropped += 1
            return None
        state = self._client(req_id.client_id, connection)
        if network_seq < state.network_seq:
            self.dropped += 1
            return None
        return state

    # ---- appends ----

    async def append(self, connection: ClientConnection, row: AppendRow, network_seq: int) -> None:
        """Handle an append request (docs/design/server.md "Appends and the lock check";
        ``docs/protocol.md`` "Append").

        Waits for the partition's recovery and for room in the store first (back pressure);
        :meth:`append_now` is the same without the waits.
        """
        table = await self._ready()
        if table is None:
            return  # closed before it opened: dropped, as appends for a partition not here are
        # Back pressure first: from the checks below to marking the pending locks nothing may
        # await, or two appends on the same lock could both pass, or a mount could slip between.
        while self._full() and not self.store.closed:
            self._capacity.clear()
            await self._capacity.wait()
        self._append(table, connection, row, network_seq)

    def append_now(self, connection: ClientConnection, row: AppendRow, network_seq: int) -> bool:
        """Handle an append at once when nothing needs waiting for (the common case).

        Returns:
            False, having done nothing, when the partition is still recovering or the store is full:
            then call :meth:`append` (in the same order relative to the connection's other requests).
        """
        table = self._lock_table
        if table is None or self._full():
            return False
        self._append(table, connection, row, network_seq)
        return True

    def _append(
        self,
        table: LockTable,
        connection: ClientConnection,
        row: AppendRow,
        network_seq: int,
    ) -> None:
        req_id, mark, write_hashes, read_hashes, append_hashes, header, data, checksum, traceparent, epoch = (
            row
        )
        state = self._sender(connection, req_id, network_seq)
        if state is None:
            return
        gate = self._epoch_gate
        if gate is not None:
            # The epoch check, in the append order and before the lock check: every append alike,
            # with locks or without (docs/design/splits.md "Why no update is lost").
            refusal = gate.refusal(epoch)
            if refusal is not None:
                self.epoch_refusals += 1
                connection.send(refusal.to_proto(req_id.to_proto()))
                return
        if zlib.crc32(data) != checksum:
            connection.send(_error(req_id.to_proto(), "append data does not match its checksum: resend it"))
            return
        # Each lock's slots are computed once: they serve the check, the locks in flight and the
        # update.
        slots_of = table.slots_of
        write_slots = slots_of(write_hashes) if write_hashes else []
        checked_slots = write_slots + slots_of(read_hashes) if read_hashes else write_slots
        pending = self._pending_locks
        if checked_slots:
            conflict = table.conflict_in_slots(mark, checked_slots)
            if conflict is not None:
                self.lock_failures += 1
                connection.send(_lock_failure(req_id, conflict))
                return
            held, holder = pending.holder(write_hashes + read_hashes)
            if held:
                # Fails at once; the failure names the holding append's transaction once it
                # resolves (or, with no holder to name, the high-water mark now).
                self.lock_failures += 1
                if holder is None:
                    connection.send(_lock_failure(req_id, self.high_water_mark))
                else:
                    self._defer_lock_failure(connection, req_id, holder)
                return
        state.pending += 1
        if state.pending == 1:
            state.idle.clear()
        written_slots = write_slots + slots_of(append_hashes) if append_hashes else write_slots
        slots: Collection[int]
        if len(written_slots) == 1:
            slots = written_slots[0]  # one lock: its slot indexes as they are
        else:
            slots = {slot for indexes in written_slots for slot in indexes}
        hashes = write_hashes + append_hashes
        entry = _InFlight(self, state, slots, hashes, time.perf_counter(), connection, req_id)
        if hashes:
            pending.hold(hashes, entry)
        self.appends += 1
        if traceparent and tracing.server is not None:  # a traced transaction (docs/tracing.md)
            entry.span = tracing.server.append_started(traceparent, req_id, mark)
        # Resolved within the commit (no future, no loop round per append): the lock table is
        # raised, and the lock failures waiting for this append are sent, in the same step that
        # hands the transaction to the feed, just before it.
        self.store.enqueue(req_id, header, data, checksum, entry.resolved, entry.span)

    def _resolved(
        self, entry: _InFlight, transaction_id: int | None, error: BaseException | None = None
    ) -> None:
        """An append left the store: committed as ``transaction_id``, or failed (None). One that a
        recovery of the store dropped (:class:`AppendFailedError`: above the recovered high-water
        mark, never to commit) is refused to its client as a lock failure naming the high-water
        mark, so that the context runs again (docs/design/server.md "Appends and the lock
        check"); one whose fate is undecided is not answered (the next owner decides)."""
        if entry.span is not None and tracing.server is not None:
            tracing.server.append_resolved(entry.span, transaction_id)
        slots = entry.slots
        if transaction_id is not None:
            if slots and self._lock_table is not None:
                self._lock_table.update_slots(transaction_id, slots)
            if self._observe_commits is not None:
                self._committed_received.append(entry.received)
        if entry.hashes:
            self._pending_locks.release(entry.hashes, entry)
        if entry.waiters:
            named = self.high_water_mark if transaction_id is None else transaction_id
            for connection, req_id in entry.waiters:
                connection.send(_lock_failure(req_id, named))
        if isinstance(error, AppendFailedError):
            entry.connection.send(_lock_failure(entry.req_id, self.high_water_mark))
        state = entry.state
        state.pending -= 1
        if state.pending == 0:
            state.idle.set()
            if not state.connections:
                self._forget_if_unused(state)
        if not self._capacity.is_set() and not self._full():
            self._capacity.set()  # appends wait for room only while it is clear

    def _full(self) -> bool:
        """True while the store holds as many records or bytes as appends may queue (back pressure)."""
        config = self.config
        return (
            self.store.pending_records >= config.max_pending
            or self.store.pending_bytes >= config.max_pending_bytes
        )

    def _defer_lock_failure(self, connection: ClientConnection, req_id: ReqId, blocking: _InFlight) -> None:
        """Refuse an append whose lock a pending append holds, once that one is resolved (the
        failure then names its transaction, or the high-water mark when it failed)."""
        if blocking.waiters is None:
            blocking.waiters = []
        blocking.waiters.append((connection, req_id))

    # ---- mount, feed, flush ----

    def mount(
        self, connection: ClientConnection, request: client_pb2.MountRequest
    ) -> Coroutine[Any, Any, None]:
        """Mount (``docs/protocol.md`` "Mount"): drop older connections, wait for the client's
        appends to resolve, stream the feed from its high-water mark, then answer ready.

        Call it in the order the connection's messages arrive: an unmount received later cancels
        this mount even while it waits (the returned awaitable does the waiting), and the mount's
        feed window (``feed_window``) applies from here on, raised by the FeedWindow messages that
        follow it.
        """
        if request.feed_window > 0:
            self._windows[connection.connection_id] = request.client_high_water_mark + request.feed_window
        else:
            self._windows.pop(connection.connection_id, None)
        return self._mount(connection, request, self._unmounts.get(connection.connection_id, 0))

    async def _mount(
        self, connection: ClientConnection, request: client_pb2.MountRequest, unmounts: int
    ) -> None:
        if request.req_id.generation != self.generation or self.store.closed:
            connection.send(_mount_response(request.req_id, ready=False))
            return
        state = self._client(request.req_id.client_id, connection)
        state.network_seq = max(state.network_seq, request.seq_num)
        await self._ready()
        await state.idle.wait()
        if self._unmounts.get(connection.connection_id, 0) != unmounts:
            return  # an unmount received after this mount cancels it (docs/protocol.md "Unmount")
        if self.store.closed:
            # The client's appends may be undecided: only the next owner can answer "ready".
            connection.send(_mount_response(request.req_id, ready=False))
            return
        old = self._cursors.pop(connection.connection_id, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        if request.client_high_water_mark > self.high_water_mark:
            # Recovered and opened (a new child's genesis appended): the mark is the log's own.
            self._refuse_ahead(connection, request)
            return
        cursor = _Cursor(connection, request, request.client_high_water_mark + 1)
        self._cursors[connection.connection_id] = cursor
        cursor.task = asyncio.get_running_loop().create_task(self._catch_up(cursor, first=True))

    def _refuse_ahead(self, connection: ClientConnection, request: client_pb2.MountRequest) -> None:
        """Refuse a mount whose client high-water mark is above the partition's committed one
        (``CLIENT_AHEAD_OF_LOG``, docs/design/server.md "Mount and feed"): the client's database
        holds transactions this log never committed, so a feed after its mark would never show
        the client its own commits. Nothing of the mount is kept (no cursor, no window)."""
        mark, high_water_mark = request.client_high_water_mark, self.high_water_mark
        message = _ahead_of_log_message(self.partition_id, mark, high_water_mark)
        log.warning(
            "partition %d: refused the mount of client %d on connection %d: %s",
            self.partition_id,
            request.req_id.client_id,
            connection.connection_id,
            message,
        )
        self._windows.pop(connection.connection_id, None)
        self.refused_mounts += 1
        connection.send(
            client_pb2.ServerMessage(
                error=client_pb2.ServerError(
                    req_id=request.req_id,
                    message=message,
                    code=client_pb2.CLIENT_AHEAD_OF_LOG,
                    client_high_water_mark=mark,
                    high_water_mark=high_water_mark,
                )
            )
        )

    async def _catch_up(self, cursor: _Cursor, first: bool) -> None:
        """Send a cursor everything committed after it, then switch it to the realtime feed.

        It parks the cursor instead when the client's feed window ends first (a FeedWindow resumes
        it); the mount response (``first``) waits until the feed reached the high-water mark.
        """
        connection = cursor.connection
        windows = self._windows
        try:
            while not self.store.closed:
                if connection.backlog() > self.config.max_backlog // 2:
                    await asyncio.sleep(0.01)
                    continue
                window = windows.get(connection.connection_id)
                if window is not None and cursor.next_id > window and cursor.next_id <= self.high_water_mark:
                    cursor.parked = True  # no await since the check: a FeedWindow sees it parked
                    self.parked_feeds += 1
                    return
                if cursor.next_id > self.high_water_mark:
                    cursor.realtime = True  # no await since the check: no commit can slip between
                    if first:
                        connection.send(_mount_response(cursor.mount.req_id, ready=True))
                        cursor.answered = True
                    return
                entries = self._cached(cursor.next_id)
                if entries is not None:
                    self.feed_cache_hits += 1
                else:
                    self.feed_cache_misses += 1
                    records = await self.read_records(cursor.next_id, self.config.feed_page)
                    if not records:
                        await asyncio.sleep(0.01)
                        continue
                    entries = [(r.transaction_id, r.req_id, r.header) for r in records]
                self._feed_run(cursor, entries, window)
        except ArchivedReadError as exc:
            # Not a hang, not a skip: the client is told why (its mount is not ready, or its feed
            # is suspended) and mounts again after a pause; the range stays unread until the
            # archive can give it.
            log.error(
                "partition %d: feed to connection %d stopped: %s",
                self.partition_id,
                connection.connection_id,
                exc,
            )
            connection.send(_error(cursor.mount.req_id, str(exc)))
            if cursor.answered:
                self._suspend(cursor)
            else:
                self._cursors.pop(connection.connection_id, None)
        except (WaltzError, TimeoutError) as exc:
            log.warning(
                "partition %d: feed to connection %d stopped: %s",
                self.partition_id,
                connection.connection_id,
                exc,
            )
            self._suspend(cursor)

    async def read_records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Committed records from ``transaction_id`` on (at most ``max_records``), from the
        replicas, or from the archive below their local start (docs/design/archive.md, "Reads
        below the local start").

        Returns:
            Consecutive records from ``transaction_id`` (empty above the high-water mark); a read
            from the archive stops at the local start, the next read goes to the replicas.

        Raises:
            ArchivedReadError: the range is below the replicas' local start and the archive cannot
                give it (the message names the partition, the range and the archive).
            StoreClosedError: the partition is closed.
            TimeoutError: no replica answered the read.
        """
        if transaction_id < self._archived_below:
            return await self._read_archived(transaction_id, max_records, self._archived_below)
        try:
            return await self.store.read_records(transaction_id, max_records)
        except RecordsArchivedError as gap:
            self._archived_below = max(self._archived_below, gap.local_start)
            return await self._read_archived(transaction_id, max_records, gap.local_start)

    async def _read_archived(self, first: int, max_records: int, local_start: int) -> list[Record]:
        if self._archived is None:
            raise ArchivedReadError(
                self.partition_id, first, local_start - 1, None, "this server reads no archive"
            )
        records = await self._archived.read(self.partition_id, first, max_records, local_start)
        self.archived_reads += len(records)
        return records

    def _cached(self, transaction_id: int) -> list[FeedEntry] | None:
        feed = self._feed
        if not feed or feed[0][0] > transaction_id:
            return None
        start = transaction_id - feed[0][0]
        return [feed[i] for i in range(start, min(len(feed), start + self.config.feed_page))]

    def _committed(self, records: list[Record]) -> None:
        """Called by the store, in order, with newly committed records: cache them and feed them."""
        if self._committed_received and self._observe_commits is not None:
            now = time.perf_counter()
            received, self._committed_received = self._committed_received, []
            self._observe_commits([now - at for at in received])
        entries: list[FeedEntry] = []
        for record in records:
            entry = (record.transaction_id, record.req_id, record.header)
            self._feed.append(entry)
            entries.append(entry)
            self._data.put(record.transaction_id, record.data, record.checksum)
        if not entries or not self._cursors:
            return
        windows = self._windows
        columns = feed_columns(entries)  # shared by every client that takes the whole run
        for cursor in list(self._cursors.values()):
            if not cursor.realtime:
                continue
            if cursor.connection.backlog() > self.config.max_backlog:
                # A slow client: stop pushing, let it catch up from the cache and storage.
                cursor.realtime = False
                cursor.task = asyncio.get_running_loop().create_task(self._catch_up(cursor, first=False))
                continue
            if self._feed_run(cursor, entries, windows.get(cursor.connection.connection_id), columns):
                # The client's feed window is full: park until a FeedWindow grants more.
                cursor.realtime = False
                cursor.parked = True
                self.parked_feeds += 1

    def _feed_run(
        self,
        cursor: _Cursor,
        entries: Sequence[FeedEntry],
        window: int | None,
        columns: FeedColumns | None = None,
    ) -> bool:
        """Send ``cursor`` the consecutive entries from its next transaction on, up to ``window``,
        as one ``FeedEntries`` message (``columns``: those of all of ``entries``, if known).

        Returns:
            True when the window stopped the run before the end of ``entries``.
        """
        count = len(entries)
        if not count:
            return False
        first = entries[0][0]
        start = cursor.next_id - first
        if start < 0 or start >= count or entries[start][0] != cursor.next_id:
            return False
        end = count
        if entries[-1][0] != first + count - 1:  # not consecutive: the consecutive run from start
            end = start + 1
            while end < count and entries[end][0] == first + end:
                end += 1
        stopped = False
        if window is not None and first + end - 1 > window:
            stopped = True
            end = max(start, window - first + 1)
        if end > start:
            if columns is None or start or end != count:
                columns = feed_columns(entries[start:end])
            cursor.connection.send_feed(self.partition_id, cursor.next_id, columns)
            cursor.next_id = first + end
        return stopped

    def _suspend(self, cursor: _Cursor) -> None:
        self._cursors.pop(cursor.connection.connection_id, None)
        if cursor.task is not None and cursor.task is not asyncio.current_task():
            cursor.task.cancel()
        cursor.connection.send(
            client_pb2.ServerMessage(feed_suspended=client_pb2.FeedSuspended(req_id=cursor.mount.req_id))
        )

    def feed_window(
        self, connection: ClientConnection, request: client_pb2.FeedWindow, network_seq: int
    ) -> None:
        """Let this connection's feed go up to ``window_end`` (``docs/protocol.md`` "Feed window").

        A client bounds the transactions it holds for its application (``client.maxApplyBacklog``)
        by mounting with a feed window and granting more as its application applies them. The
        window only grows; a feed parked at its end resumes from where it stopped (feed cache,
        else storage, then realtime), and a mount still catching up gets its response once the
        feed reaches the high-water mark. No answer; dropped like the other requests when it
        carries another generation or comes from an older connection of the client.

        Args:
            connection: the client stream the request came on.
            request: the grant.
            network_seq: the network sequence number of the connection's latest mount.
        """
        if self._stale(connection, request.req_id, network_seq):
            return
        connection_id = connection.connection_id
        window = self._windows.get(connection_id)
        if window is None or request.window_end <= window:
            return  # no limit (mounted without a window), or nothing new
        self._windows[connection_id] = request.window_end
        self.feed_windows += 1
        cursor = self._cursors.get(connection_id)
        if cursor is not None and cursor.parked and cursor.next_id <= request.window_end:
            cursor.parked = False
            cursor.task = asyncio.get_running_loop().create_task(
                self._catch_up(cursor, first=not cursor.answered)
            )

    def unmount(self, connection: ClientConnection, request: client_pb2.UnmountRequest) -> None:
        """Unmount (``docs/protocol.md`` "Unmount"): stop this connection's feed, no answer.

        Removes the connection's realtime or catch-up feed and cancels a mount of it still waiting
        for the client's appends. Idempotent: unmounting a partition the connection has not mounted
        does nothing. Dropped when it comes from an older connection of the client (lower network
        ``seq_num``) or carries another generation, like the other requests.

        Args:
            connection: the client stream the request came on.
            request: the unmount request.
        """
        if self._stale(connection, request.req_id, request.seq_num):
            return
        self._unmounts[connection.connection_id] = self._unmounts.get(connection.connection_id, 0) + 1
        self._windows.pop(connection.connection_id, None)
        cursor = self._cursors.pop(connection.connection_id, None)
        if cursor is not None and cursor.task is not None:
            cursor.task.cancel()
        log.info(
            "partition %d: client %d unmounted it on connection %d",
            self.partition_id,
            request.req_id.client_id,
            connection.connection_id,
        )

    def disconnect(self, connection: ClientConnection) -> None:
        """Forget a closed connection: its feed, and the state of the client IDs it came with that
        no other open connection carries (once their appends are resolved)."""
        for client_id in self._connection_clients.pop(connection.connection_id, ()):
            state = self._clients.get(client_id)
            if state is not None:
                state.connections.discard(connection.connection_id)
                self._forget_if_unused(state)
        self._unmounts.pop(connection.connection_id, None)
        self._windows.pop(connection.connection_id, None)
        cursor = self._cursors.pop(connection.connection_id, None)
        if cursor is not None and cursor.task is not None:
            cursor.task.cancel()

    async def flush(
        self, connection: ClientConnection, request: client_pb2.FlushRequest, network_seq: int
    ) -> None:
        """Answer once every append of this client received before has resolved.

        A partition whose store closed meanwhile does not answer: the appends it left in flight are
        undecided, and the client (whose feed was suspended) learns their fate from the next owner
        (docs/design/server.md "Flush and high-water-mark requests").
        """
        if self._stale(connection, request.req_id, network_seq):
            return
        await self._client(request.req_id.client_id, connection).idle.wait()
        if self.store.closed:
            return
        connection.send(
            client_pb2.ServerMessage(
                flush=client_pb2.FlushResponse(req_id=request.req_id, transaction_id=self.high_water_mark)
            )
        )

    async def high_water_mark_request(
        self, connection: ClientConnection, request: client_pb2.HighWaterMarkRequest
    ) -> None:
        """Answer with the committed high-water mark."""
        if request.req_id.generation != self.generation:
            return
        await self._ready()
        if self.store.closed:
            return  # dropped, as for a partition not here: the client asks the next owner
        connection.send(
            client_pb2.ServerMessage(
                high_water_mark=client_pb2.HighWaterMarkResponse(
                    req_id=request.req_id, transaction_id=self.high_water_mark
                )
            )
        )

    async def transaction_data_range(
        self, first: int, count: int, max_bytes: int = DATA_RANGE_MAX_BYTES
    ) -> list[tuple[bytes, int]]:
        """Data and checksums of consecutive committed transactions ``first``, ``first + 1``, ...

        Served from the recent-data cache while it has them, then with one read from storage.

        Args:
            first: the first transaction ID.
            count: transactions wanted (at most :data:`DATA_RANGE_MAX_COUNT` are returned).
            max_bytes: stop before the data would exceed this many bytes (one is always returned).

        Returns:
            A prefix of the range: empty when ``first`` is not committed (or is negative), shorter
            than ``count`` at the high-water mark or at ``max_bytes``.

        Raises:
            ArchivedReadError: the range is below the replicas' local start and the archive cannot
                give it.
            StoreClosedError: the partition closed.
            TimeoutError: no replica answered the read.
        """
        last = min(self.high_water_mark, first + min(count, DATA_RANGE_MAX_COUNT) - 1)
        found: list[tuple[bytes, int]] = []
        if first < 0:
            return found
        size = 0
        next_id = first
        cache = self._data
        while next_id <= last:
            cached = cache.get(next_id)
            if cached is None:
                break
            if found and size + len(cached[0]) > max_bytes:
                return found
            found.append(cached)
            size += len(cached[0])
            next_id += 1
        self.data_cache_hits += len(found)
        if next_id > last:
            return found
        records = await self.read_records(next_id, last - next_id + 1)
        self.data_cache_misses += len(records)
        for record in records:
            if record.transaction_id != next_id or (found and size + len(record.data) > max_bytes):
                break
            found.append((record.data, record.checksum))
            size += len(record.data)
            next_id += 1
        return found


def _ahead_of_log_message(partition_id: int, client_high_water_mark: int, high_water_mark: int) -> str:
    """What a ``CLIENT_AHEAD_OF_LOG`` refusal says (docs/protocol.md "Mount").

    Args:
        partition_id: the partition.
        client_high_water_mark: the mount's mark.
        high_water_mark: the partition's committed high-water mark.

    Returns:
        The refusal's message: both marks, the likely causes and what to do.
    """
    return (
        f"client high-water mark {client_high_water_mark} is above partition {partition_id}'s high-water "
        f"mark {high_water_mark}: the application's database is ahead of this log (restored from another "
        "cluster? wrong cluster root?); point the client at the cluster the database was applied from, or "
        "rebuild the database from this log (waltz rebuild)"
    )


def _lock_failure(req_id: ReqId, transaction_id: int) -> client_pb2.ServerMessage:
    return client_pb2.ServerMessage(
        lock_failure=client_pb2.LockFailure(req_id=req_id.to_proto(), transaction_id=transaction_id)
    )


def _mount_response(req_id: common_pb2.ReqId, *, ready: bool) -> client_pb2.ServerMessage:
    return client_pb2.ServerMessage(mount=client_pb2.MountResponse(req_id=req_id, partition_ready=ready))


def _error(req_id: common_pb2.ReqId, message: str) -> client_pb2.ServerMessage:
    return client_pb2.ServerMessage(error=client_pb2.ServerError(req_id=req_id, message=message))
