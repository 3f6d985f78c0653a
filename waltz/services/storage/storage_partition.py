"""A partition on a storage node: its segments, store-session fencing and low-water marks.

Design: docs/design/storage.md "Fencing by store session ID", "Files on disk", "Storage requests"
(the requests it serves); docs/design/archive.md, "Retention on the storage nodes" (its local
start, archived-through, reset start and the deletion of archived segments).
The partition is driven from one I/O thread (the storage node gives each partition its own), so
requests on it are applied strictly in order and blocking file I/O stays off the event loop;
the one exception is an append from the only store session stream appending on the node, which
the node may run on its event loop while nothing of the partition is on that thread
(``StorageNode.run``).
Either way, one thread at a time.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from waltz.errors import (
    BelowCommittedError,
    CorruptDataError,
    DiskFullError,
    PartitionUnavailableError,
    ProtocolError,
    RecordsArchivedError,
    SessionFencedError,
    SessionJumpTooLargeError,
    SessionNotOpenError,
)
from waltz.private_files import private_directory
from waltz.protocol.records import Record, RecordHeader
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile, FenceReset, held_records_lost
from waltz.services.storage.fsutil import fsync_directory
from waltz.services.storage.retention import (
    DeletedSegment,
    RetentionSettings,
    SegmentSpan,
    segments_to_delete,
)
from waltz.services.storage.retention_file import RetentionRecord, load_archived_through, write_retention_file
from waltz.services.storage.segment import CorruptionInfo, Segment
from waltz.services.storage.segment_chain import open_segments

__all__ = ["DEFAULT_MAX_FENCE_JUMP", "CommittedTruncation", "PartitionStats", "StoragePartition"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE_THRESHOLD = 1 << 30
DEFAULT_CHECKPOINT_INTERVAL = 1000
DEFAULT_MAX_RESPONSE_BYTES = 4 << 20
#: The largest raise of a partition's fence one request may make (``storage.fence.maxJump``):
#: 2^32 sessions. ZooKeeper's counter grows by one per store session, so no replica misses that
#: many, while one forged request moves the fence at most 2^-31 of the ID space (the reasons:
#: docs/decisions/0028-fences-only-writers-raise.md).
DEFAULT_MAX_FENCE_JUMP = 1 << 32


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """Statistics of a partition (``waltz disk stats``, admin status)."""

    partition_id: int
    segments: int
    records: int
    record_bytes: int  # on-disk size of the records, their 40 bytes of framing included
    first_transaction_id: int
    max_transaction_id: int
    corruption: CorruptionInfo | None


@dataclass(frozen=True, slots=True)
class CommittedTruncation:
    """What an operator's truncation below the committed transactions changed
    (docs/design/storage.md, "The committed floor").

    Attributes:
        partition_id: the partition.
        previous_max_transaction_id: the highest transaction stored before.
        max_transaction_id: and now (the transaction asked for, or the max if it was lower).
        previous_low_water_mark: the partition's low-water mark before.
        low_water_mark: and now (lowered to the transaction asked for when it was above it).
    """

    partition_id: int
    previous_max_transaction_id: int
    max_transaction_id: int
    previous_low_water_mark: int
    low_water_mark: int


class StoragePartition:
    """One partition's log on a storage node.

    Args:
        directory: the partition directory (``<storage directory>/<partition id>``).
        partition_id: the partition ID.
        control_file: the node's control file (partition info and fence).
        segment_size_threshold: bytes after which a new segment is started.
        checkpoint_interval: transactions between index flushes (1,000 by default,
            docs/design/storage.md "Durability").
        max_fence_jump: the largest raise of the fence one request may make
            (``storage.fence.maxJump``, at least 1).
        first_transaction_id: where the log starts when the directory holds no segment yet (a
            partition created to start there: docs/design/archive.md, "Terms"); at least 0.
    """

    def __init__(
        self,
        directory: Path,
        partition_id: int,
        control_file: ControlFile,
        *,
        segment_size_threshold: int = DEFAULT_SEGMENT_SIZE_THRESHOLD,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        max_fence_jump: int = DEFAULT_MAX_FENCE_JUMP,
        first_transaction_id: int = 0,
    ) -> None:
        if max_fence_jump < 1:
            raise ValueError(f"max_fence_jump must be at least 1, not {max_fence_jump}")
        if first_transaction_id < 0:
            raise ValueError(f"first_transaction_id must be at least 0, not {first_transaction_id}")
        self._start = first_transaction_id
        self.max_fence_jump = max_fence_jump
        self.directory = directory
        self.partition_id = partition_id
        self._control = control_file
        self._cluster_key: uuid.UUID = control_file.cluster_key
        self._threshold = segment_size_threshold
        self._checkpoint_interval = checkpoint_interval
        self._segments: list[Segment] = []
        self._archived_through = -1
        self.readable = True
        self.writable = True
        self._closed = False

    # ---- life cycle ----

    @classmethod
    def create(
        cls, directory: Path, partition_id: int, control_file: ControlFile, **kwargs: int
    ) -> StoragePartition:
        """Create the partition directory (if missing) and open the partition.

        ``kwargs`` are the constructor's keyword arguments; ``first_transaction_id`` starts a
        partition that has no segment yet at that transaction.
        """
        created = not directory.exists()
        private_directory(directory, narrow=True)
        if created:
            fsync_directory(directory.parent)
        partition = cls(directory, partition_id, control_file, **kwargs)
        partition.open()
        return partition

    def open(self) -> None:
        """Open the segments, recover the last one, create the first one if there is none, and
        read the partition's archived-through (docs/design/storage.md "Start-up checks and torn
        tails"; docs/design/archive.md, "Retention on the storage nodes"). Records that end below
        the local low-water mark are logged as an ERROR (:func:`held_records_lost`).

        Raises:
            CorruptDataError: a segment header is invalid, or the segments do not chain.
        """
        self._segments = open_segments(
            self.directory, self.partition_id, self._cluster_key, self._checkpoint_interval, self._start
        )
        self._archived_through = load_archived_through(self.directory, self.partition_id)
        log.info(
            "partition %d: opened %d segment(s), transactions %d to %d%s%s",
            self.partition_id,
            len(self._segments),
            self.local_start,
            self.max_transaction_id,
            "" if self._archived_through < 0 else f", archived through {self._archived_through}",
            "" if self.corruption is None else f", CORRUPT at transaction {self.corruption.transaction_id}",
        )
        try:
            info = self._control.partition_info(self.partition_id)
        except CorruptDataError:
            return  # both structs corrupt: the control file's own error says so
        lost = held_records_lost(self.max_transaction_id, info)
        if lost is not None:
            log.error("partition %d: %s", self.partition_id, lost)

    def close(self) -> None:
        """Flush and close every segment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()
        self._segments = []

    def delete_files(self) -> None:
        """Close the partition and remove its directory with all its files.

        Raises:
            OSError: a file or the directory could not be removed (what remains stays; the
                operator's request fails and may be made again).
        """
        self.close()
        if self.directory.exists():
            shutil.rmtree(self.directory)
        fsync_directory(self.directory.parent)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (the partition was unassigned or the node stopped)."""
        return self._closed

    # ---- state ----

    @property
    def local_start(self) -> int:
        """The first transaction ID held on this disk: the first segment's first transaction
        (docs/design/archive.md, "Terms"). ``max_transaction_id + 1`` when the partition is empty."""
        return self._segments[0].first_transaction_id

    @property
    def archived_through(self) -> int:
        """What the archiver last said is archived (-1: nothing, or the retention file was damaged)."""
        return self._archived_through

    @property
    def max_transaction_id(self) -> int:
        """The highest transaction ID stored (-1 when empty); not necessarily committed."""
        return self._segments[-1].max_transaction_id

    @property
    def corruption(self) -> CorruptionInfo | None:
        """The corrupt record found at start-up, if any (reads from it on fail)."""
        return self._segments[-1].corruption if self._segments else None

    def stats(self) -> PartitionStats:
        """Return the partition's statistics."""
        return PartitionStats(
            self.partition_id,
            len(self._segments),
            sum(s.count for s in self._segments),
            sum(s.valid_end - fmt.HEADER_SIZE for s in self._segments),
            self._segments[0].first_transaction_id,
            self.max_transaction_id,
            self.corruption,
        )

    # ---- sessions (docs/design/storage.md "Fencing by store session ID") ----

    def check_session(self, session_id: int, *, opens: bool) -> None:
        """Fence by store session ID (docs/design/storage.md "Fencing by store session ID").

        A session ID equal to the fence is served. A lower one is refused. A higher one raises the
        fence, persisted before this returns, only when the request ``opens`` the session here (an
        open-session request or a write) and stays within :attr:`max_fence_jump` of the fence;
        a read never moves the fence.

        Args:
            session_id: the request's store session ID.
            opens: the request may take the partition for its session (open-session, truncate,
                set low-water mark, append); False for reads.

        Raises:
            ProtocolError: ``session_id`` is negative (store session IDs start at 0).
            SessionFencedError: ``session_id`` is lower than the fence.
            SessionNotOpenError: a read whose ``session_id`` is above the fence.
            SessionJumpTooLargeError: ``session_id`` is more than :attr:`max_fence_jump` above the
                fence; the fence stays.
        """
        if session_id < 0:
            raise ProtocolError(
                f"partition {self.partition_id}: store session ID {session_id} is negative "
                "(store session IDs start at 0)"
            )
        fence = self._control.fence(self.partition_id)
        if session_id == fence:
            return
        if session_id < fence:
            raise SessionFencedError(self.partition_id, session_id, fence)
        if not opens:
            raise SessionNotOpenError(self.partition_id, session_id, fence)
        if session_id - fence > self.max_fence_jump:
            log.warning(
                "partition %d: refused store session %d: %d above the fence %d (storage.fence.maxJump %d)",
                self.partition_id,
                session_id,
                session_id - fence,
                fence,
                self.max_fence_jump,
            )
            raise SessionJumpTooLargeError(self.partition_id, session_id, fence, self.max_fence_jump)
        self._control.set_fence(self.partition_id, session_id)
        log.info("partition %d: store session %d fences session %d", self.partition_id, session_id, fence)

    def reset_fence(self, session_id: int) -> FenceReset:
        """Set the fence to ``session_id``, lower or higher: an operator's repair of a fence a
        forged or corrupt session ID raised (docs/design/storage.md "Fencing by store session ID").

        Raises:
            ValueError: ``session_id`` is below -1.
        """
        return self._control.reset_fence(self.partition_id, session_id)

    @property
    def current_session_id(self) -> int:
        """The highest store session ID seen (the fence)."""
        return self._control.fence(self.partition_id)

    def last_session_info(self) -> fmt.PartitionInfo:
        """The partition info of the last session that set the low-water mark.

        See docs/design/storage.md "Storage requests" (last session info) and "Control file".
        """
        return self._control.partition_info(self.partition_id)

    def check_low_water_mark(self, session_id: int, low_water_mark: int) -> None:
        """Refuse a low-water mark below the current one; changes nothing (docs/design/storage.md,
        "The committed floor").

        Raises:
            BelowCommittedError: ``low_water_mark`` is below the current low-water mark.
        """
        floor = self._control.partition_info(self.partition_id).low_water_mark
        if low_water_mark < floor:
            raise BelowCommittedError(
                self.partition_id,
                low_water_mark,
                floor,
                f"refused to set the low-water mark to {low_water_mark} for store session {session_id}: "
                f"it is {floor}, and a store session never lowers it",
            )

    def set_low_water_mark(self, session_id: int, low_water_mark: int) -> None:
        """Record that ``session_id`` has reached the cluster high-water mark ``low_water_mark``
        (at the end of its recovery, then as it commits).

        The local low-water mark is the highest valid transaction ID stored here, capped at the
        low-water mark (docs/design/storage.md "Control file"). The low-water mark never goes down
        by this request (docs/design/storage.md, "The committed floor").

        Raises:
            BelowCommittedError: ``low_water_mark`` is below the current low-water mark.
            PartitionUnavailableError: writes are switched off.
        """
        self._require_writable()
        self.check_low_water_mark(session_id, low_water_mark)
        local = min(self.max_transaction_id, low_water_mark)
        self._control.set_partition_info(
            self.partition_id, fmt.PartitionInfo(session_id, low_water_mark, local)
        )

    # ---- writes ----

    def _require_writable(self) -> None:
        if not self.writable:
            raise PartitionUnavailableError(
                f"partition {self.partition_id} is not writable on this storage node (admin toggle)",
                for_writes=True,
            )

    def _require_readable(self) -> None:
        if not self.readable:
            raise PartitionUnavailableError(
                f"partition {self.partition_id} is not readable on this storage node (admin toggle)",
                for_writes=False,
            )

    def append(self, records: list[Record]) -> None:
        """Append records with consecutive transaction IDs after the current max; flush once.

        Raises:
            ProtocolError: the IDs do not follow the max transaction ID, or a data CRC is wrong.
            CorruptDataError: the partition holds a corrupt record at its tail (truncate first).
            DiskFullError: no space left; the log is unchanged.
            PartitionUnavailableError: writes are switched off.
        """
        self.append_rows(map(fmt.record_row, records))

    def _corrupt(self, corruption: CorruptionInfo, message: str) -> CorruptDataError:
        """The error for a request the corrupt record at the tail stops (file, offset, transaction)."""
        return CorruptDataError(
            message,
            path=str(self._segments[-1].data_path),
            partition_id=self.partition_id,
            offset=corruption.offset,
            transaction_id=corruption.transaction_id,
        )

    def append_rows(self, rows: Iterable[fmt.WireRow]) -> int:
        """Append records as received on the wire (the storage service's path: rows of
        :func:`format.wire_rows` or :func:`format.column_rows`); flush once.

        Returns:
            The number of transaction data bytes appended.

        Raises:
            As :meth:`append`.
        """
        self._require_writable()
        rows = iter(rows)
        try:
            first = next(rows, None)  # nothing to append is no error, even after corruption
            if first is None:
                return 0
            corruption = self.corruption
            if corruption is not None:
                raise self._corrupt(
                    corruption,
                    f"cannot append after corruption: {corruption.reason}; truncate the partition below it",
                )
            encoded, offsets = fmt.encode_wire_rows(chain((first,), rows), self.max_transaction_id + 1)
        except fmt.RecordOrderError as exc:
            raise ProtocolError(f"partition {self.partition_id}: {exc}") from None
        if self._segments[-1].valid_end >= self._threshold:
            self._roll()  # an earlier roll failed: nothing is appended yet, so its error is honest
        segment = self._segments[-1]
        segment.append(encoded, offsets)
        if segment.valid_end >= self._threshold:
            try:
                self._roll()
            except (OSError, DiskFullError) as exc:
                # The records are on disk and flushed: the append succeeded. The next one rolls.
                log.warning(
                    "partition %d: appended up to transaction %d, but rolling to a new segment failed "
                    "(%s); the next append tries again",
                    self.partition_id,
                    self.max_transaction_id,
                    exc,
                )
        return len(encoded) - fmt.RECORD_FIXED_SIZE * len(offsets)

    def _roll(self) -> None:
        """Seal the last segment and start a new one after it.

        Raises:
            DiskFullError: no space for the new segment (nothing of it is left behind).
            OSError: another I/O error.
        """
        self._segments[-1].seal()
        self._segments.append(
            Segment.create(
                self.directory,
                self.partition_id,
                self._cluster_key,
                self.max_transaction_id + 1,
                self._checkpoint_interval,
            )
        )

    @property
    def committed_floor(self) -> int:
        """The lowest transaction a store session may truncate to: the low-water mark, or the max
        transaction ID when the replica holds less (a truncation to or above it removes nothing)
        (docs/design/storage.md, "The committed floor")."""
        return min(self._control.partition_info(self.partition_id).low_water_mark, self.max_transaction_id)

    def truncate(self, transaction_id: int) -> None:
        """Remove every record after ``transaction_id``, never one at or below the low-water mark
        (docs/design/storage.md "Storage requests", "The committed floor").

        Raises:
            BelowCommittedError: ``transaction_id`` is below :attr:`committed_floor`; nothing is
                removed (an operator's truncation below it is :meth:`truncate_below_committed`).
            ProtocolError: ``transaction_id`` is below -1, or below ``local_start - 1`` (the log
                would then have a gap: docs/design/archive.md, "Retention on the storage nodes").
        """
        self._require_writable()
        self.check_truncation(transaction_id)
        self._truncate(transaction_id)

    def check_truncation(self, transaction_id: int) -> None:
        """Refuse what :meth:`truncate` refuses for ``transaction_id``; changes nothing.

        Raises:
            BelowCommittedError, ProtocolError: as :meth:`truncate`.
        """
        self._check_truncation_bounds(transaction_id)
        floor = self.committed_floor
        if transaction_id < floor:
            raise BelowCommittedError(
                self.partition_id,
                transaction_id,
                floor,
                f"refused to truncate to transaction {transaction_id}: the low-water mark is "
                f"{self._control.partition_info(self.partition_id).low_water_mark} and this replica "
                f"holds up to {self.max_transaction_id}",
            )

    def truncate_below_committed(self, transaction_id: int) -> CommittedTruncation:
        """An operator's truncation, below the committed transactions if asked: remove every record
        after ``transaction_id`` and lower the low-water mark to it (docs/design/storage.md, "The
        committed floor"). The admin port allows it to the ``admin`` role only, and logs it.

        The low-water mark is lowered first (flushed), then the records are removed: a crash in
        between leaves every record and a lower floor, and the operator runs it again.

        Raises:
            ProtocolError: ``transaction_id`` is below -1, below ``local_start - 1``, or below the
                archived-through (the archive would keep the removed transactions).
            PartitionUnavailableError: writes are switched off.
        """
        self._require_writable()
        self._check_truncation_bounds(transaction_id)
        if transaction_id < self._archived_through:
            # The archive keeps what it holds: the removed transactions would come back to every
            # reader below the local start in place of the ones committed next under their IDs
            # (docs/design/archive.md, "Reads below the local start").
            raise ProtocolError(
                f"partition {self.partition_id}: cannot truncate to transaction {transaction_id}: the "
                f"archive holds this partition through transaction {self._archived_through} (as the "
                f"archiver told this replica) and keeps transactions {transaction_id + 1}.."
                f"{self._archived_through} whatever the replicas hold: once retention deleted their "
                "segments, readers below the local start would read them from the archive in place of "
                "the transactions committed next under their IDs; pass over a poison transaction in "
                f"the applications instead (waltz db skip), or truncate to {self._archived_through} or "
                "above"
            )
        previous_max = self.max_transaction_id
        previous = self._control.partition_info(self.partition_id)
        info = self._control.lower_low_water_mark(self.partition_id, transaction_id)
        self._truncate(transaction_id)
        return CommittedTruncation(
            self.partition_id,
            previous_max,
            self.max_transaction_id,
            previous.low_water_mark,
            info.low_water_mark,
        )

    def _check_truncation_bounds(self, transaction_id: int) -> None:
        if transaction_id < -1:
            raise ProtocolError(
                f"partition {self.partition_id}: cannot truncate to transaction {transaction_id}"
            )
        if transaction_id < self.local_start - 1:
            raise ProtocolError(
                f"partition {self.partition_id}: cannot truncate to transaction {transaction_id}: "
                f"this replica's log starts at {self.local_start} (the transactions before it are "
                "archived), so the log would have a gap; truncate to "
                f"{self.local_start - 1} or above"
            )

    def _truncate(self, transaction_id: int) -> None:
        removed = False
        while len(self._segments) > 1 and self._segments[-1].first_transaction_id > transaction_id:
            segment = self._segments.pop()
            log.info("partition %d: truncate removes segment %s", self.partition_id, segment.data_path.name)
            segment.delete()
            removed = True
        if removed:
            fsync_directory(self.directory)
        self._segments[-1].truncate_after(transaction_id)

    def check_reset_start(self, first_transaction_id: int) -> None:
        """Refuse what :meth:`reset_start` refuses; changes nothing.

        A reset start discards every record the replica holds and leaves out the transactions up
        to ``first_transaction_id - 1``: those must be in the archive, as the archiver told this
        node (``set archived through``, an admin request), whoever asks. A store session (the
        ``server`` role) may not erase committed transactions the archive is not known to hold,
        as it may not truncate below the committed floor (docs/design/archive.md, "Reads below
        the local start"). A replica that has not been told yet is refused until the archiver's
        next round tells it; the server's catch-up tries again. A replica that holds no record
        discards nothing: it may start anywhere above its max + 1 (a replica added to a split's
        child, whose log starts after its parent's barrier, or to a partition restored from the
        archive, catches up from its peers' local start so).

        Raises:
            ProtocolError: not above ``max_transaction_id + 1``, or, for a replica holding
                records, above ``archived_through + 1``.
        """
        if first_transaction_id <= self.max_transaction_id + 1:
            raise ProtocolError(
                f"partition {self.partition_id}: cannot start the log at transaction "
                f"{first_transaction_id}: a reset start must be above the max transaction ID + 1 "
                f"({self.max_transaction_id + 1}); the replica can copy from there"
            )
        holds_records = self.max_transaction_id >= self.local_start
        if holds_records and first_transaction_id - 1 > self._archived_through:
            raise ProtocolError(
                f"partition {self.partition_id}: refused to start the log at transaction "
                f"{first_transaction_id}: the transactions below it would be on no replica of this "
                f"node, and this node knows the archive holds the partition through "
                f"{self._archived_through} only; nothing was changed (the archiver tells it what "
                "the archive holds: waltz archive run)"
            )

    def reset_start(self, first_transaction_id: int) -> None:
        """Discard every record and start the log at ``first_transaction_id`` (docs/design/archive.md,
        "Reads below the local start": a replica that cannot copy a gap starts after it).

        The segments are deleted newest first (index, then data file), the directory is
        flushed, then the new empty segment is created and flushed with its directory, all before
        this returns. A crash in between leaves a prefix of the old log (or, once every segment
        is gone, an empty log that start-up starts at 0): a replica further behind, never a gap
        (docs/format.md, "Durability rules"). The maximum transaction ID becomes
        ``first_transaction_id - 1``.

        Raises:
            ProtocolError: ``first_transaction_id`` is not above ``max_transaction_id + 1``, or this
                node has not been told that the archive holds every transaction below it
                (:meth:`check_reset_start`).
            PartitionUnavailableError: writes are switched off.
            OSError, DiskFullError: a file could not be removed or created (start-up opens what
                is left).
        """
        self._require_writable()
        self.check_reset_start(first_transaction_id)
        old = list(self._segments)
        while self._segments:
            self._segments.pop().delete()
        fsync_directory(self.directory)
        self._segments = open_segments(
            self.directory,
            self.partition_id,
            self._cluster_key,
            self._checkpoint_interval,
            first_transaction_id,
        )
        log.warning(
            "partition %d: log reset to start at transaction %d: %d segment(s) discarded "
            "(transactions %d to %d); the transactions below are in the archive",
            self.partition_id,
            first_transaction_id,
            len(old),
            old[0].first_transaction_id,
            old[-1].max_transaction_id,
        )

    # ---- retention (docs/design/archive.md, "Retention on the storage nodes") ----

    def set_archived_through(self, transaction_id: int, *, archive: str = "", operator: str = "") -> int:
        """Keep what the archiver says is archived, lower or higher, in ``retention.json``.

        Args:
            transaction_id: every transaction up to it is archived and verified (-1: none).
            archive: the archive's location, kept for logs and status.
            operator: who set it, as the tool states it.

        Returns:
            The archived-through before.

        Raises:
            ProtocolError: ``transaction_id`` is below -1.
            OSError: the file could not be written (the value stays as it was).
        """
        if transaction_id < -1:
            raise ProtocolError(
                f"partition {self.partition_id}: archived-through cannot be {transaction_id} (at least -1)"
            )
        previous = self._archived_through
        write_retention_file(
            self.directory, RetentionRecord(self.partition_id, transaction_id, archive, operator)
        )
        self._archived_through = transaction_id
        return previous

    def segment_spans(self) -> list[SegmentSpan]:
        """What a retention decision needs of each segment, oldest first: a segment counts as
        sealed when the next one was created (the creation time in that one's header)."""
        segments = self._segments
        return [
            SegmentSpan(
                segment.first_transaction_id,
                segment.max_transaction_id,
                segment.valid_end,
                segments[i + 1].header.creation_time_ms / 1000 if i + 1 < len(segments) else None,
            )
            for i, segment in enumerate(segments)
        ]

    def apply_retention(self, settings: RetentionSettings, now: float) -> list[DeletedSegment]:
        """Delete the oldest segments the retention policy lets go, each logged.

        Each goes by its index file, then its data file, then the directory is flushed; the
        local start moves to the first remaining segment. Run on the partition's I/O thread, like
        every other operation on its segments.

        Args:
            settings: the node's retention settings.
            now: the time, in seconds since the epoch.

        Returns:
            The segments deleted, oldest first.

        Raises:
            OSError: a file could not be removed (the segments before it are gone; it stays).
        """
        count = segments_to_delete(self.segment_spans(), self._archived_through, settings, now)
        deleted: list[DeletedSegment] = []
        for _ in range(count):
            segment = self._segments[0]
            gone = DeletedSegment(
                self.partition_id,
                segment.data_path.name,
                segment.first_transaction_id,
                segment.max_transaction_id,
                segment.valid_end,
            )
            self._segments.pop(0)
            segment.delete()
            fsync_directory(self.directory)
            log.info(
                "partition %d: retention deleted segment %s (transactions %d to %d, %d bytes; archived "
                "through %d); the local start is now %d",
                self.partition_id,
                gone.file_name,
                gone.first_transaction_id,
                gone.max_transaction_id,
                gone.size,
                self._archived_through,
                self.local_start,
            )
            deleted.append(gone)
        return deleted

    # ---- reads ----

    def _segment_for(self, transaction_id: int) -> Segment | None:
        if transaction_id < 0 or transaction_id > self.max_transaction_id:
            return None
        low, high = 0, len(self._segments) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self._segments[middle].first_transaction_id <= transaction_id:
                low = middle
            else:
                high = middle - 1
        return self._segments[low]

    def read_records(
        self, transaction_id: int, max_records: int, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    ) -> list[Record]:
        """Read up to ``max_records`` consecutive records from ``transaction_id`` on.

        The list may span segments and stops early at ``max_bytes`` (at least one record is read)
        or at the max transaction ID; it is empty when ``transaction_id`` is above the max.

        Raises:
            RecordsArchivedError: ``transaction_id`` is below the local start (docs/design/archive.md,
                "Reads below the local start").
            CorruptDataError: a record fails its checks.
            PartitionUnavailableError: reads are switched off.
        """
        self._require_readable()
        if 0 <= transaction_id < self.local_start:
            raise RecordsArchivedError(self.partition_id, transaction_id, self.local_start)
        corruption = self.corruption
        if corruption is not None and transaction_id >= corruption.transaction_id:
            raise self._corrupt(corruption, f"corrupt record: {corruption.reason}")
        records: list[Record] = []
        budget = max_bytes
        next_id = transaction_id
        while len(records) < max_records:
            segment = self._segment_for(next_id)
            if segment is None:
                break
            batch = segment.read_records(next_id, max_records - len(records), budget)
            if not batch:
                break
            if records and sum(len(r.data) + fmt.RECORD_FIXED_SIZE for r in batch) > budget:
                break
            records.extend(batch)
            budget -= sum(len(r.data) + fmt.RECORD_FIXED_SIZE for r in batch)
            next_id = records[-1].transaction_id + 1
            if budget <= 0:
                break
        return records

    def read_record(self, transaction_id: int) -> Record | None:
        """Read one record, or None when it is above the max (below the local start: as
        :meth:`read_records`)."""
        records = self.read_records(transaction_id, 1)
        return records[0] if records else None

    def read_headers(
        self, transaction_id: int, max_records: int, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    ) -> list[RecordHeader]:
        """Read record headers (records are read whole so that every CRC is checked)."""
        return [r.record_header for r in self.read_records(transaction_id, max_records, max_bytes * 16)]
