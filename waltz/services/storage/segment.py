"""A segment of a partition's log: a data file of records and an index file of record offsets.

Design: docs/design/storage.md "Segments and index files", "Durability", "Start-up checks and torn
tails". Records are written with one ``pwrite`` and one ``fdatasync`` per batch (group commit); the
index is written with the data but flushed only every ``checkpoint_interval`` transactions, and
rebuilt at start-up from the last checkpoint by scanning records. A torn tail (an incomplete last
record, or zero bytes to the end of the file) is cut off at start-up; any other invalid record is
corruption, which is reported and never cut off.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from waltz.errors import CorruptDataError, DiskFullError
from waltz.private_files import open_private
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import Record
from waltz.services.storage import format as fmt
from waltz.services.storage.fsutil import fsync_directory, is_no_space

__all__ = ["CorruptionInfo", "Segment"]

log = logging.getLogger(__name__)

#: Bytes read per chunk when scanning a segment at start-up.
_SCAN_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CorruptionInfo:
    """Where a segment holds an invalid record that is not a torn tail."""

    transaction_id: int
    offset: int
    reason: str


class Segment:
    """One open segment (data file + index file) of a partition.

    All methods are called from one thread at a time (the partition's I/O thread, or the node's
    event loop for an inline append: ``StorageNode.run``); the class is not thread-safe.
    """

    def __init__(
        self,
        directory: Path,
        header: fmt.SegmentHeader,
        data_fd: int,
        index_fd: int,
        count: int,
        valid_end: int,
        checkpoint_interval: int,
        corruption: CorruptionInfo | None = None,
    ) -> None:
        self.directory = directory
        self.header = header
        self._data_fd: int | None = data_fd
        self._index_fd: int | None = index_fd
        #: Number of valid records (index entries) in the segment.
        self.count = count
        #: Byte offset just after the last valid record.
        self.valid_end = valid_end
        self.corruption = corruption
        self._checkpoint_interval = checkpoint_interval
        self._index_flushed_count = count

    # ---- names ----

    @property
    def first_transaction_id(self) -> int:
        """The ID of the segment's first transaction."""
        return self.header.first_transaction_id

    @property
    def partition_id(self) -> int:
        """The partition the segment belongs to."""
        return self.header.partition_id

    @property
    def max_transaction_id(self) -> int:
        """The ID of the last valid transaction (first - 1 when the segment is empty)."""
        return self.first_transaction_id + self.count - 1

    @property
    def data_path(self) -> Path:
        """The data file's path."""
        return self.directory / fmt.segment_file_name(self.first_transaction_id, fmt.SEGMENT_SUFFIX)

    @property
    def index_path(self) -> Path:
        """The index file's path."""
        return self.directory / fmt.segment_file_name(self.first_transaction_id, fmt.INDEX_SUFFIX)

    def _fds(self) -> tuple[int, int]:
        if self._data_fd is None or self._index_fd is None:
            raise ValueError(f"segment {self.data_path} is closed")
        return self._data_fd, self._index_fd

    # ---- creation and opening ----

    @classmethod
    def create(
        cls,
        directory: Path,
        partition_id: int,
        cluster_key: uuid.UUID,
        first_transaction_id: int,
        checkpoint_interval: int,
    ) -> Segment:
        """Create an empty segment whose first transaction is ``first_transaction_id``.

        Both headers are flushed and so is the directory before this returns.

        Raises:
            DiskFullError: no space for the headers (nothing is left behind).
        """
        header = fmt.SegmentHeader(
            fmt.FORMAT_VERSION, fmt.now_ms(), cluster_key, partition_id, first_transaction_id
        )
        encoded = header.encode()
        paths = [
            directory / fmt.segment_file_name(first_transaction_id, suffix)
            for suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX)
        ]
        if not paths[0].exists() and paths[1].exists():
            # Left by a crash between deleting a segment's two files (the index goes first).
            log.warning("partition %d: removing orphan index file %s", partition_id, paths[1])
            paths[1].unlink()
        fds: list[int] = []
        try:
            for path in paths:
                fd = open_private(path, os.O_RDWR | os.O_EXCL)
                fds.append(fd)
                _write_fully(fd, encoded, 0)
                os.fsync(fd)
            fsync_directory(directory)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            for path in paths:
                path.unlink(missing_ok=True)
            if is_no_space(exc):
                raise DiskFullError(
                    f"partition {partition_id}: no space to create segment {paths[0]}: {exc}"
                ) from exc
            raise
        log.info("partition %d: created segment %s", partition_id, paths[0].name)
        return cls(directory, header, fds[0], fds[1], 0, fmt.HEADER_SIZE, checkpoint_interval)

    @classmethod
    def open(
        cls,
        data_path: Path,
        *,
        partition_id: int,
        cluster_key: uuid.UUID,
        recover: bool,
        checkpoint_interval: int,
    ) -> Segment:
        """Open an existing segment.

        Args:
            data_path: the segment's data file.
            partition_id: the partition the segment must belong to.
            cluster_key: the cluster key the segment must carry.
            recover: scan records after the last index checkpoint and rebuild the index (the last
                segment of a partition; also done for any segment whose index is unusable).
            checkpoint_interval: transactions between index flushes.

        Raises:
            CorruptDataError: the header is invalid or belongs to another partition or cluster.
        """
        path_text = str(data_path)
        data_fd = os.open(data_path, os.O_RDWR)
        index_path = data_path.with_suffix(fmt.INDEX_SUFFIX)
        index_fd = -1
        try:
            header = fmt.SegmentHeader.decode(os.pread(data_fd, fmt.HEADER_SIZE, 0), path_text)
            if header.partition_id != partition_id or header.cluster_key != cluster_key:
                raise CorruptDataError(
                    f"segment belongs to partition {header.partition_id} of the cluster whose key has the "
                    f"fingerprint {cluster_key_fingerprint(header.cluster_key)}, expected partition "
                    f"{partition_id} of {cluster_key_fingerprint(cluster_key)}",
                    path=path_text,
                    partition_id=partition_id,
                    offset=0,
                )
            expected_name = fmt.segment_file_name(header.first_transaction_id, fmt.SEGMENT_SUFFIX)
            if data_path.name != expected_name:
                raise CorruptDataError(
                    f"segment header says first transaction {header.first_transaction_id}, "
                    f"but the file is named {data_path.name}",
                    path=path_text,
                    partition_id=partition_id,
                    offset=0,
                )
            index_fd = open_private(index_path, os.O_RDWR)
            index_ok = _index_header_ok(index_fd, header)
            if not index_ok:
                log.warning(
                    "partition %d: index %s is missing or invalid; rebuilding it", partition_id, index_path
                )
                os.ftruncate(index_fd, 0)
                _write_fully(index_fd, header.encode(), 0)
                recover = True
            index_entries = (os.fstat(index_fd).st_size - fmt.HEADER_SIZE) // fmt.INDEX_ENTRY_SIZE
            segment = cls(
                data_path.parent,
                header,
                data_fd,
                index_fd,
                index_entries,
                os.fstat(data_fd).st_size,
                checkpoint_interval,
            )
            if recover:
                segment._recover(index_entries)
            return segment
        except BaseException:
            os.close(data_fd)
            if index_fd >= 0:
                os.close(index_fd)
            raise

    def _recover(self, index_entries: int) -> None:
        """Rebuild the index after the last checkpoint and cut a torn tail.

        See docs/design/storage.md "Start-up checks and torn tails".
        """
        data_fd, index_fd = self._fds()
        first = self.first_transaction_id
        file_size = os.fstat(data_fd).st_size
        trusted = (index_entries // self._checkpoint_interval) * self._checkpoint_interval
        position = fmt.HEADER_SIZE
        beyond_data = False
        while trusted > 0:
            try:
                offset = self._index_entries(trusted - 1, 1, bound=file_size)[0]
                _record, size = self._decode_at(offset, trusted - 1 + first, data_fd, file_size)
                position = offset + size
                break
            except CorruptDataError:
                # The checkpoint itself is not usable: fall back to the previous one.
                beyond_data = beyond_data or self._checkpoint_beyond_data(trusted - 1, file_size)
                trusted -= self._checkpoint_interval
        rebuilt: list[int] = []
        corruption: CorruptionInfo | None = None
        cut_at: int | None = None
        buffer = b""
        buffer_start = position
        while True:
            # Decode from the buffer; refill it when a record does not fit.
            relative = position - buffer_start
            expected = first + trusted + len(rebuilt)
            try:
                record, size = fmt.decode_record_at(buffer, relative)
            except fmt.RecordProblem as problem:
                if problem.incomplete and buffer_start + len(buffer) < file_size:
                    buffer = buffer[relative:] + os.pread(data_fd, _SCAN_CHUNK, buffer_start + len(buffer))
                    buffer_start = position
                    continue
                if position >= file_size:
                    break
                torn = problem.incomplete or _all_zero(data_fd, position, file_size)
                if torn and (
                    self._later_record_indexed(expected, position, index_entries, file_size)
                    or self._next_record_follows(expected, position, file_size)
                ):
                    # A damaged length field can make a record look incomplete; a valid record
                    # after it proves that it is not the tail.
                    torn = False
                if torn:
                    cut_at = position
                else:
                    corruption = CorruptionInfo(expected, position, problem.reason)
                break
            if record.transaction_id != expected:
                corruption = CorruptionInfo(
                    expected,
                    position,
                    f"record holds transaction {record.transaction_id}, expected {expected}",
                )
                break
            rebuilt.append(position)
            position += size
        if cut_at is not None:
            kept = self._quarantine_tail(cut_at, file_size)
            log.warning(
                "partition %d: cutting a torn tail of %d bytes at offset %d of %s%s",
                self.partition_id,
                file_size - cut_at,
                cut_at,
                self.data_path,
                "" if kept is None else f" (its bytes are kept in {kept})",
            )
            os.ftruncate(data_fd, cut_at)
            os.fsync(data_fd)
        if corruption is not None:
            log.error(
                "partition %d: corrupt record in %s at offset %d (transaction %d): %s; "
                "reads from there fail until the partition is truncated below it",
                self.partition_id,
                self.data_path,
                corruption.offset,
                corruption.transaction_id,
                corruption.reason,
            )
        if beyond_data and trusted + len(rebuilt) < index_entries:
            self._report_lost_records(first + trusted + len(rebuilt), first + index_entries - 1)
        entries = fmt.encode_offsets(rebuilt)
        index_end = fmt.HEADER_SIZE + trusted * fmt.INDEX_ENTRY_SIZE
        _write_fully(index_fd, entries, index_end)
        os.ftruncate(index_fd, index_end + len(entries))
        os.fsync(index_fd)
        self.count = trusted + len(rebuilt)
        self._index_flushed_count = self.count
        self.valid_end = position
        self.corruption = corruption

    def _checkpoint_beyond_data(self, entry: int, file_size: int) -> bool:
        """Whether index entry ``entry`` (a checkpoint's) lies beyond the end of the data file
        while following the entry before it, as a written entry does (a torn write of the index
        leaves bytes that do not): the data is flushed before each checkpoint, so its records
        were flushed and are lost (docs/design/storage.md, "Start-up checks and torn tails")."""
        _, index_fd = self._fds()
        start = fmt.HEADER_SIZE + max(entry - 1, 0) * fmt.INDEX_ENTRY_SIZE
        wanted = (2 if entry > 0 else 1) * fmt.INDEX_ENTRY_SIZE
        raw = os.pread(index_fd, wanted, start)
        if len(raw) != wanted:
            return False
        offsets = fmt.decode_offsets(raw)
        previous = offsets[0] if entry > 0 else None
        return fmt.checkpoint_written(offsets[-1], previous) and offsets[-1] >= file_size

    def _report_lost_records(self, first_lost: int, last_lost: int) -> None:
        """Log the flushed records of ``first_lost`` to ``last_lost`` that the data file lost, and
        keep the index that lists them as ``<index file>.lost-<first_lost>`` (start-up never
        reads it; ``waltz disk verify`` reports it as an ERROR until it is removed)."""
        target = self.index_path.with_name(fmt.lost_index_name(self.index_path.name, first_lost))
        kept = ""
        try:
            fd = open_private(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                _write_fully(fd, self.index_path.read_bytes(), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.index_path.parent)
            kept = f"; the index that lists them is kept in {target}"
        except OSError as exc:
            kept = f"; the index that lists them could not be kept in {target} ({exc})"
        log.error(
            "partition %d: transactions %d to %d, flushed (the index checkpoint past them was "
            "written after their data was flushed), are missing from %s: the data file lost them, "
            "and the segment now ends at transaction %d%s. Restore the data file from a backup, or "
            "let the cluster's recovery copy them back from other replicas, then remove the kept "
            "index",
            self.partition_id,
            first_lost,
            last_lost,
            self.data_path,
            first_lost - 1,
            kept,
        )

    def _next_record_follows(self, expected: int, position: int, file_size: int) -> bool:
        """Whether a valid record of transaction ``expected + 1`` starts after ``position`` (within a
        record's reach): the index may not have reached it yet (it is flushed at checkpoints)."""
        data_fd, _ = self._fds()
        end = min(file_size, position + fmt.RESYNC_REACH)
        return fmt.record_follows(os.pread(data_fd, end - position, position), expected + 1)

    def _quarantine_tail(self, cut_at: int, file_size: int) -> Path | None:
        """Copy the bytes a torn-tail cut removes into ``<segment>.tail-<offset>`` (flushed; a
        further ``-<n>`` when that name is taken), unless they are all zero: start-up throws away
        no bytes it could have misjudged. When the copy cannot be written (a full disk, often why
        the node stopped), the partition still opens: the copy is dropped with an error logged.
        """
        data_fd, _ = self._fds()
        if _all_zero(data_fd, cut_at, file_size):
            return None
        target = self.data_path.with_name(f"{self.data_path.name}.tail-{cut_at}")
        for n in range(1, 1000):
            if not target.exists():
                break
            target = self.data_path.with_name(f"{self.data_path.name}.tail-{cut_at}-{n}")
        try:
            fd = open_private(target, os.O_WRONLY | os.O_EXCL)
            try:
                position = cut_at
                while position < file_size:
                    chunk = os.pread(data_fd, min(_SCAN_CHUNK, file_size - position), position)
                    _write_fully(fd, chunk, position - cut_at)
                    position += len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.data_path.parent)
        except OSError as exc:
            target.unlink(missing_ok=True)
            log.error(
                "partition %d: could not keep the %d bytes of the torn tail at offset %d of %s (%s); "
                "they are cut without a copy",
                self.partition_id,
                file_size - cut_at,
                cut_at,
                self.data_path,
                exc,
            )
            return None
        return target

    def _later_record_indexed(self, expected: int, position: int, index_entries: int, file_size: int) -> bool:
        """Whether the index points to a valid record after ``position`` for a later transaction."""
        data_fd, _ = self._fds()
        first = self.first_transaction_id
        for transaction_id in range(expected + 1, min(expected + 4, first + index_entries)):
            try:
                offset = self._index_entries(transaction_id - first, 1, bound=file_size)[0]
                if offset > position:
                    self._decode_at(offset, transaction_id, data_fd, file_size)
                    return True
            except CorruptDataError:
                continue
        return False

    # ---- reads ----

    def _index_entry(self, index: int) -> int:
        return self._index_entries(index, 1)[0]

    def _index_entries(self, index: int, count: int, *, bound: int | None = None) -> list[int]:
        """Read ``count`` index entries from entry ``index`` on, checking them.

        Args:
            bound: offsets must be below this (default: the end of the valid records).

        Raises:
            CorruptDataError: an entry is missing, out of the file, or not increasing.
        """
        _, index_fd = self._fds()
        size = count * fmt.INDEX_ENTRY_SIZE
        position = fmt.HEADER_SIZE + index * fmt.INDEX_ENTRY_SIZE
        raw = os.pread(index_fd, size, position)
        if len(raw) != size:
            raise CorruptDataError(
                f"index has fewer entries than the segment's {self.count} records",
                path=str(self.index_path),
                partition_id=self.partition_id,
                offset=position,
                transaction_id=self.first_transaction_id + index,
            )
        offsets = fmt.decode_offsets(raw)
        limit = self.valid_end if bound is None else bound
        previous = fmt.HEADER_SIZE - 1
        for i, offset in enumerate(offsets):
            if not previous < offset < limit:
                raise CorruptDataError(
                    f"index entry {offset} is outside the records (after {previous}, below {limit})",
                    path=str(self.index_path),
                    partition_id=self.partition_id,
                    offset=position + i * fmt.INDEX_ENTRY_SIZE,
                    transaction_id=self.first_transaction_id + index + i,
                )
            previous = offset
        return offsets

    def _decode_at(
        self, offset: int, transaction_id: int, data_fd: int, file_size: int
    ) -> tuple[Record, int]:
        try:
            if not fmt.HEADER_SIZE <= offset <= file_size - fmt.RECORD_FIXED_SIZE:
                raise fmt.RecordProblem(f"offset {offset} is outside the file", incomplete=False)
            head = os.pread(data_fd, fmt.RECORD_HEADER_SIZE, offset)
            size = fmt.record_size(head)
            if offset + size > file_size:
                raise fmt.RecordProblem("record extends beyond the end of the file", incomplete=True)
            record, size = fmt.decode_record_at(
                head + os.pread(data_fd, size - len(head), offset + len(head)), 0
            )
        except fmt.RecordProblem as problem:
            raise self._corrupt(problem.reason, offset, transaction_id) from None
        if record.transaction_id != transaction_id:
            raise self._corrupt(f"record holds transaction {record.transaction_id}", offset, transaction_id)
        return record, size

    def _corrupt(self, reason: str, offset: int, transaction_id: int) -> CorruptDataError:
        return CorruptDataError(
            f"corrupt record: {reason}",
            path=str(self.data_path),
            partition_id=self.partition_id,
            offset=offset,
            transaction_id=transaction_id,
        )

    def _check_readable(self, transaction_id: int) -> None:
        corruption = self.corruption
        if corruption is not None and transaction_id >= corruption.transaction_id:
            raise self._corrupt(corruption.reason, corruption.offset, corruption.transaction_id)

    def read_records(self, transaction_id: int, max_records: int, max_bytes: int) -> list[Record]:
        """Read up to ``max_records`` records from ``transaction_id`` on, verifying every CRC.

        At least one record is returned when ``transaction_id`` is in the segment, even if it is
        larger than ``max_bytes``; otherwise reading stops before ``max_bytes`` would be exceeded.

        Raises:
            CorruptDataError: a record fails its checks (with file, offset and transaction ID).
        """
        index = transaction_id - self.first_transaction_id
        available = self.count - index
        if index < 0 or available <= 0 or max_records <= 0:
            return []
        self._check_readable(transaction_id)
        data_fd, _ = self._fds()
        # No more index entries than the byte budget can hold records (each has a fixed part):
        # a request for millions of records costs what its answer can carry, not more.
        wanted = min(max_records, available, max_bytes // fmt.RECORD_FIXED_SIZE + 1)
        offsets = self._index_entries(index, wanted)
        start = offsets[0]
        end_of_range = (
            self.valid_end if index + wanted == self.count else self._index_entries(index + wanted, 1)[0]
        )
        # Keep at least one record; stop before max_bytes.
        n = wanted
        while n > 1 and (offsets[n] if n < wanted else end_of_range) - start > max_bytes:
            n -= 1
        end = end_of_range if n == wanted else offsets[n]
        if end <= start:
            raise self._corrupt(f"index offsets not increasing ({start} to {end})", start, transaction_id)
        buffer = os.pread(data_fd, end - start, start)
        records: list[Record] = []
        position = 0
        for i in range(n):
            expected_txn = transaction_id + i
            try:
                record, size = fmt.decode_record_at(buffer, position)
            except fmt.RecordProblem as problem:
                raise self._corrupt(problem.reason, start + position, expected_txn) from None
            if record.transaction_id != expected_txn:
                raise self._corrupt(
                    f"record holds transaction {record.transaction_id}", start + position, expected_txn
                )
            records.append(record)
            position += size
        return records

    # ---- writes ----

    def append(self, encoded: bytes, relative_offsets: list[int]) -> None:
        """Append encoded records, write their index entries and flush the data (group commit).

        Args:
            encoded: records encoded back to back by :func:`format.encode_records`.
            relative_offsets: each record's offset within ``encoded``.

        Raises:
            DiskFullError: no space left; both files are cut back to their previous size.
            OSError: another I/O error; both files are cut back as far as possible.
        """
        data_fd, index_fd = self._fds()
        start = self.valid_end
        index_start = fmt.HEADER_SIZE + self.count * fmt.INDEX_ENTRY_SIZE
        entries = fmt.encode_offsets(relative_offsets, start)
        try:
            _write_fully(data_fd, encoded, start)
            _write_fully(index_fd, entries, index_start)
            os.fdatasync(data_fd)
        except OSError as exc:
            self._cut_back(start, index_start)
            if is_no_space(exc):
                raise DiskFullError(
                    f"partition {self.partition_id}: no space left to append {len(relative_offsets)} "
                    f"records to {self.data_path} ({exc.strerror}); the log is unchanged"
                ) from exc
            raise
        self.count += len(relative_offsets)
        self.valid_end = start + len(encoded)
        if self.count // self._checkpoint_interval > self._index_flushed_count // self._checkpoint_interval:
            os.fdatasync(index_fd)
            self._index_flushed_count = self.count

    def _cut_back(self, data_end: int, index_end: int) -> None:
        data_fd, index_fd = self._fds()
        for fd, size in ((data_fd, data_end), (index_fd, index_end)):
            try:
                os.ftruncate(fd, size)
            except OSError:
                log.exception(
                    "partition %d: could not cut %s back to %d bytes", self.partition_id, self.data_path, size
                )

    def truncate_after(self, transaction_id: int) -> None:
        """Remove every record after ``transaction_id`` and flush both files.

        Removing the corrupt part of a segment clears its corruption.
        """
        keep = max(0, min(self.count, transaction_id - self.first_transaction_id + 1))
        corrupt = self.corruption is not None
        if keep == self.count and not corrupt:
            return
        data_fd, index_fd = self._fds()
        new_end = self.valid_end if keep == self.count else self._index_entry(keep)
        os.ftruncate(data_fd, new_end)
        os.ftruncate(index_fd, fmt.HEADER_SIZE + keep * fmt.INDEX_ENTRY_SIZE)
        os.fsync(data_fd)
        os.fsync(index_fd)
        log.info(
            "partition %d: truncated %s after transaction %d (%d records removed%s)",
            self.partition_id,
            self.data_path.name,
            transaction_id,
            self.count - keep,
            ", corruption removed" if corrupt else "",
        )
        self.count = keep
        self.valid_end = new_end
        self._index_flushed_count = keep
        self.corruption = None

    def seal(self) -> None:
        """Flush both files: the segment is complete and a new one follows it."""
        data_fd, index_fd = self._fds()
        os.fsync(data_fd)
        os.fsync(index_fd)
        self._index_flushed_count = self.count

    def close(self) -> None:
        """Flush the index and close both files. Idempotent."""
        if self._data_fd is None or self._index_fd is None:
            return
        try:
            os.fsync(self._index_fd)
        finally:
            os.close(self._data_fd)
            os.close(self._index_fd)
            self._data_fd = None
            self._index_fd = None

    def delete(self) -> None:
        """Close the segment and remove both files (the caller flushes the directory)."""
        if self._data_fd is not None and self._index_fd is not None:
            os.close(self._data_fd)
            os.close(self._index_fd)
            self._data_fd = None
            self._index_fd = None
        # The index first: a crash in between leaves a data file that start-up re-indexes,
        # never an orphan index that would block re-creating the segment.
        self.index_path.unlink(missing_ok=True)
        self.data_path.unlink(missing_ok=True)

    @property
    def data_size(self) -> int:
        """The data file's size in bytes (its valid part ends at :attr:`valid_end`)."""
        data_fd, _ = self._fds()
        return os.fstat(data_fd).st_size


def _all_zero(fd: int, start: int, end: int) -> bool:
    """Whether bytes ``start`` to ``end`` of the file are all zero (read in chunks)."""
    position = start
    while position < end:
        chunk = os.pread(fd, min(_SCAN_CHUNK, end - position), position)
        if not chunk:
            break
        if chunk.strip(b"\0"):
            return False
        position += len(chunk)
    return True


def _write_fully(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _index_header_ok(index_fd: int, header: fmt.SegmentHeader) -> bool:
    raw = os.pread(index_fd, fmt.HEADER_SIZE, 0)
    try:
        index_header = fmt.SegmentHeader.decode(raw, "index")
    except CorruptDataError:
        return False
    return (
        index_header.partition_id == header.partition_id
        and index_header.cluster_key == header.cluster_key
        and index_header.first_transaction_id == header.first_transaction_id
    )
