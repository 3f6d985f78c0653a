"""Catching a lagging replica up while its store session writes.

Design: docs/design/recovery.md "Catching up in the background". A replica that is below the
session's high-water mark (it was down, or new) does not hold the session's writes back: the
session writes to the replicas that are in step, and a :class:`ReplicaCatchUp` copies the records
the lagging replica lacks from one of them, page by page and at a bounded rate
(``storage.catchUpPage``, ``storage.catchUpRate``). Once the replica holds every record up to the
start of the batches the session still keeps (its recent batches), it joins the session's writers:
those batches are sent to it in order, then every new batch, so that its appends always follow
its log contiguously. From then on its acknowledgements count towards the quorum.

A replica that returns during a session is first cleaned under the session's ID by the rules of
docs/design/recovery.md "Cleaning each replica", its low-water mark set, and its replica state in
ZooKeeper made a member of the session by compare-and-set, before anything is copied: its records
are then always a prefix of the session's log, so that any later recovery may count its vote.
A failure of the replica, or of the copy, ends the catch-up, never the session; the session's
probe tries the replica again.

A catch-up measures its lag (:attr:`ReplicaCatchUp.lag`: the committed records the replica lacks),
which the server's metrics show per replica. A copy slower than the writes never lets the replica
join: when the lag grew over ``StoreConfig.catch_up_lag_window`` seconds, the catch-up says so at
WARNING, at most once a window, naming the replica and ``storage.catchUpRate``.

When the writer it copies from no longer holds the replica's next records (retention deleted
them: they are below the writer's local start, and archived), the replica cannot copy the gap: it
is reset to start at that local start, and the copy goes on from there (docs/design/archive.md,
"Reads below the local start").

A catch-up sees its session through :class:`JoinableSession`, the few things it asks of it, and is
given the ZooKeeper handle and the partition ID explicitly: it imports nothing of the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from kazoo.exceptions import KazooException

from waltz.errors import RecordsArchivedError, StaleMetadataError, WaltzError
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk, Versioned
from waltz.protocol.storage_client import columns_append
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.recovery import LaggingReplica, clean_replica
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError

__all__ = ["CatchUpStoppedError", "JoinableSession", "ReplicaCatchUp", "join_session_metadata"]

log = logging.getLogger(__name__)

#: Seconds a catch-up waits for the session's replicas to flush more records before it looks again.
PROGRESS_WAIT = 0.05


class CatchUpStoppedError(WaltzError):
    """A catch-up could not go on (another session took over the partition, or its metadata
    could not be updated); the replica stays out of the session."""


class JoinableSession(Protocol):
    """What a catch-up asks of the store session its replica joins
    (docs/design/recovery.md "Catching up in the background").

    Implemented by :class:`~waltz.services.server.store.store_session.StoreSession`.
    """

    @property
    def session_id(self) -> int:
        """The session's ID (the replica is cleaned and enrolled under it)."""

    @property
    def start_high_water_mark(self) -> int:
        """The session's starting high-water mark (a returning replica's low-water mark)."""

    @property
    def ending(self) -> bool:
        """True once the session takes no new records (the catch-up stops)."""

    @property
    def config(self) -> StoreConfig:
        """Store settings (``catch_up_page``, ``catch_up_rate``, ``catch_up_lag_window``,
        ``retry_interval``)."""

    @property
    def high_water_mark(self) -> int:
        """The session's committed high-water mark (a catch-up's lag is measured from it)."""

    def join(self, storage: str, connection: ReplicaConnection, last: int) -> bool:
        """Make the replica a writer if the session's kept batches reach back to ``last + 1``."""

    def catch_up_source(self) -> tuple[ReplicaConnection, int] | None:
        """The writer to copy from and its last flushed transaction ID (None: no writer)."""

    async def wait_for_acknowledgements(self, timeout: float) -> None:
        """Wait until a writer acknowledges a batch, at most ``timeout`` seconds."""


def join_session_metadata(zk: ClusterZk, partition_id: int, session_id: int, storage: str) -> int:
    """Make ``storage`` a replica of store session ``session_id`` in the partition metadata.

    By compare-and-set, re-read on a conflict (docs/design/recovery.md "Catching up in the
    background"). The replica's state becomes ``(session_id, unresolved)``: a later recovery keeps
    its records and counts its vote.

    Returns:
        The znode version written.

    Raises:
        CatchUpStoppedError: the metadata names another session, or kept changing.
    """
    current: Versioned[PartitionMetadata] = zk.partition_metadata(partition_id)
    for _ in range(50):
        if current.value.session_id != session_id:
            raise CatchUpStoppedError(
                f"partition {partition_id}: session {current.value.session_id} replaced session {session_id}"
            )
        replicas = dict(current.value.replicas)
        replicas[storage] = ReplicaState(session_id, None)
        try:
            return zk.set_partition_metadata(
                partition_id, current.value.evolve(replicas=replicas), current.version
            )
        except StaleMetadataError:
            current = zk.partition_metadata(partition_id)
    raise CatchUpStoppedError(f"partition {partition_id}: could not update its metadata for {storage}")


class ReplicaCatchUp:
    """Copies what one lagging replica lacks while the session writes, then has it join.

    Args:
        session: the store session the replica joins.
        zk: the cluster's znodes (a returning replica is enrolled in the partition metadata).
        partition_id: the partition.
        storage: the replica's storage node.
        lagging: the replica as its session's recovery left it (connection open, cleaned, a member
            of the session); None for a replica that returned during the session, which is reached
            and cleaned first.
        connect: opens a replica connection under the session's ID.
    """

    def __init__(
        self,
        session: JoinableSession,
        zk: ClusterZk,
        partition_id: int,
        storage: str,
        lagging: LaggingReplica | None,
        connect: Callable[[str], ReplicaConnection],
    ) -> None:
        self.session = session
        self._zk = zk
        self._partition_id = partition_id
        self.storage = storage
        self._lagging = lagging
        self._connect = connect
        self.joined = False
        self._reached = lagging is not None
        self.copied = 0
        """Records copied so far."""
        self.next_transaction_id: int | None = None
        """The next record the replica needs (None until it is reached and cleaned)."""
        # The lag at the start of the current window, and when it started (_watch_lag).
        self._window_lag: int | None = None
        self._window_start = 0.0

    @property
    def lag(self) -> int | None:
        """Committed records the replica lacks: the session's high-water mark minus the replica's
        last record, at least 0 (docs/design/recovery.md "Catching up in the background").

        Returns:
            The lag, or None while the replica is not reached and cleaned yet.
        """
        if self.next_transaction_id is None:
            return None
        return max(0, self.session.high_water_mark - self.next_transaction_id + 1)

    async def run(self) -> None:
        """Reach (if need be), copy, join; log and return when the replica or the copy fails."""
        connection: ReplicaConnection | None = None
        try:
            if self._lagging is None:
                connection = self._connect(self.storage)
                mark = await self._reach(connection)
            else:
                connection, mark = self._lagging.connection, self._lagging.high_water_mark
            await self._copy(connection, mark)
        except ReplicaError as exc:
            # A node that is still down is no news: the session's probe tries it again.
            # A node of another cluster is a configuration error to fix: say it loudly.
            loud = self._reached or exc.code == "CLUSTER_KEY_MISMATCH"
            level = logging.WARNING if loud else logging.DEBUG
            log.log(
                level,
                "partition %d: catch-up of the replica on %s stopped after %d records: %s",
                self._partition_id,
                self.storage,
                self.copied,
                exc,
            )
        except CatchUpStoppedError as exc:
            log.info(
                "partition %d: catch-up of the replica on %s stopped: %s",
                self._partition_id,
                self.storage,
                exc,
            )
        except Exception:
            # Unexpected: said here, since nobody awaits this task; the session's probe tries again.
            log.exception(
                "partition %d: catch-up of the replica on %s failed", self._partition_id, self.storage
            )
        finally:
            if connection is not None and not self.joined:
                with contextlib.suppress(Exception):
                    await connection.close()

    async def discard(self) -> None:
        """Close the lagging replica's connection when :meth:`run` never started (the session
        closed first); a run that started closes its own connection."""
        if self._lagging is not None and not self.joined:
            with contextlib.suppress(Exception):
                await self._lagging.connection.close()

    async def _reach(self, connection: ReplicaConnection) -> int:
        """Open, clean and enroll a replica that returned during the session; returns its mark."""
        session = self.session
        zk = self._zk
        await connection.open()
        self._reached = True
        try:
            current = await asyncio.to_thread(zk.partition_metadata, self._partition_id)
        except (WaltzError, KazooException) as exc:
            raise CatchUpStoppedError(f"cannot read the partition metadata: {exc}") from exc
        if current.value.session_id != session.session_id:
            raise CatchUpStoppedError(
                f"session {current.value.session_id} replaced session {session.session_id}"
            )
        state = current.value.replicas.get(self.storage)
        if state is not None and state.unresolved and state.session_id != session.session_id:
            state = None  # not closed by this session's recovery: keep only what its own mark says
        mark = (await clean_replica(self._partition_id, self.storage, connection, state)).high_water_mark
        # A writer of this session that returns may hold a higher mark the session set on it: a
        # low-water mark never goes down (docs/design/storage.md, "The committed floor").
        _, own_mark = await connection.last_session_info()
        await connection.set_low_water_mark(max(session.start_high_water_mark, own_mark))
        try:
            await asyncio.to_thread(
                join_session_metadata, zk, self._partition_id, session.session_id, self.storage
            )
        except CatchUpStoppedError:
            raise
        except (WaltzError, KazooException) as exc:
            raise CatchUpStoppedError(f"cannot update the partition metadata: {exc}") from exc
        log.info(
            "partition %d: replica on %s is back at transaction %d; catching it up while session %d writes",
            self._partition_id,
            self.storage,
            mark,
            session.session_id,
        )
        return mark

    async def _copy(self, connection: ReplicaConnection, mark: int) -> None:
        """Copy pages from the session's most advanced writer until the replica can join; across
        a gap the writer no longer holds, the replica starts after it
        (:meth:`ReplicaConnection.skip_gap`)."""
        session = self.session
        config = session.config
        rate = config.catch_up_rate
        started = time.monotonic()
        copied_bytes = 0
        next_id = mark + 1
        first = next_id
        self.next_transaction_id = next_id
        self._window_start, self._window_lag = started, self.lag
        while not session.ending:
            self.next_transaction_id = next_id
            self._watch_lag()
            if session.join(self.storage, connection, next_id - 1):
                self.joined = True
                log.info(
                    "partition %d: replica on %s caught up (%d records copied from %d) and joins session %d",
                    self._partition_id,
                    self.storage,
                    self.copied,
                    first,
                    session.session_id,
                )
                return
            source = session.catch_up_source()
            if source is None or source[1] < next_id:
                await session.wait_for_acknowledgements(PROGRESS_WAIT)
                continue
            source_connection, available = source
            count = min(config.catch_up_page, available - next_id + 1)
            try:
                records = await source_connection.records(next_id, count)
            except RecordsArchivedError as gap:
                next_id = await connection.skip_gap(source_connection, next_id, gap)
                continue
            except ReplicaError as exc:
                # The source's own failure is the session's business; try again, maybe elsewhere.
                log.info(
                    "partition %d: catch-up read from %s failed: %s", self._partition_id, exc.storage, exc
                )
                await asyncio.sleep(config.retry_interval)
                continue
            if not records or records[0].transaction_id != next_id:
                raise ReplicaError(
                    source_connection.storage,
                    self._partition_id,
                    "MISSING",
                    f"no record {next_id} to copy to {self.storage}",
                )
            await connection.start_append(columns_append(records))  # in columns, as a store batch
            next_id = records[-1].transaction_id + 1
            self.copied += len(records)
            if rate > 0:
                copied_bytes += sum(len(r.data) for r in records)
                delay = started + copied_bytes / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

    def _watch_lag(self) -> None:
        """Warn, at most once a window, when the lag grew over the last window by more than a
        page (what one round of copying moves it by): the copy is slower than the writes, and the
        replica never joins at this pace."""
        config = self.session.config
        now = time.monotonic()
        elapsed = now - self._window_start
        if elapsed < config.catch_up_lag_window:
            return
        lag, before = self.lag, self._window_lag
        self._window_start, self._window_lag = now, lag
        if lag is None or before is None or lag - before <= config.catch_up_page:
            return
        rate = config.catch_up_rate
        log.warning(
            "partition %d: catch-up of the replica on %s is slower than the writes: %d committed "
            "records behind, %d more than %.0f s ago (%d copied so far); it joins the session only once "
            "the copy overtakes the writes: %s",
            self._partition_id,
            self.storage,
            lag,
            lag - before,
            elapsed,
            self.copied,
            f"raise storage.catchUpRate ({rate:.0f} bytes/s now) or reduce the write rate"
            if rate > 0
            else "storage.catchUpRate sets no limit, so reduce the write rate or look at the replica's "
            "storage node",
        )
