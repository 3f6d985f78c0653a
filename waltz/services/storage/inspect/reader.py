"""Reading a storage node's files read-only: the control file dump, segment and index files.

Design: docs/design/storage.md "Files on disk"; ``docs/format.md``. Nothing here writes, truncates or
creates a file: files are opened read-only and segment data files are streamed in chunks (a
segment can be 1 GiB). Every byte layout comes from :mod:`waltz.services.storage.format`, and the
rules that pick the current partition-info struct and the fence come from
:mod:`waltz.services.storage.control_file`, so a dump shows what a storage node would use.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from waltz.errors import CorruptDataError, StorageNotInitializedError
from waltz.protocol.records import Record
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import current_fence, current_struct

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ControlFileDump",
    "ControlPartition",
    "FenceSlot",
    "IndexFile",
    "PartitionInfoStruct",
    "RecordScan",
    "ScanStop",
    "ScannedRecord",
    "SegmentFile",
    "StopKind",
    "classify_stop",
    "find_record_offset",
    "later_record_indexed",
    "read_control_file",
    "require_storage_directory",
]

#: Bytes read per chunk when streaming a segment data file.
DEFAULT_CHUNK_SIZE: Final = 8 * 1024 * 1024
#: Index entries read per chunk.
_INDEX_CHUNK_ENTRIES: Final = 64 * 1024
#: Transactions after an invalid record whose index entries start-up consults (``segment.py``).
_TORN_TAIL_LOOKAHEAD: Final = 3
#: Size of the partition ID field that starts each control file body entry, before its structs.


# ---- control file ----


@dataclass(frozen=True, slots=True)
class PartitionInfoStruct:
    """One of the two partition-info structs of a partition; ``info`` is None when its CRC fails."""

    index: int
    offset: int
    info: fmt.PartitionInfo | None


@dataclass(frozen=True, slots=True)
class FenceSlot:
    """One of the two fence slots of a partition; ``session_id`` is None when its CRC fails."""

    index: int
    offset: int
    session_id: int | None


@dataclass(frozen=True, slots=True)
class ControlPartition:
    """A partition's entry in the control file, decoded as ``ControlFile.open`` does.

    Attributes:
        partition_id: the partition (its position in the body).
        offset: byte offset of the entry (its partition ID field).
        stored_partition_id: the partition ID field; when it differs, both structs count as corrupt.
        structs: the two partition-info structs.
        current_struct: the struct in use (the highest valid one), None when both are corrupt.
        fence_slots: the two fence slots.
        fence: the effective fence: the highest valid slot, at least the current session ID.
    """

    partition_id: int
    offset: int
    stored_partition_id: int
    structs: tuple[PartitionInfoStruct, PartitionInfoStruct]
    current_struct: int | None
    fence_slots: tuple[FenceSlot, FenceSlot]
    fence: int

    @property
    def info(self) -> fmt.PartitionInfo | None:
        """The current partition info (None when both structs are corrupt)."""
        return None if self.current_struct is None else self.structs[self.current_struct].info


@dataclass(frozen=True, slots=True)
class ControlFileDump:
    """The decoded control file.

    Attributes:
        path: the control file.
        size: its size in bytes.
        header: the 128-byte header.
        partitions: one entry per partition of the header.
        trailing_bytes: bytes after the fence section (0 in a healthy file).
    """

    path: Path
    size: int
    header: fmt.ControlFileHeader
    partitions: tuple[ControlPartition, ...]
    trailing_bytes: int


def require_storage_directory(storage_dir: Path) -> Path:
    """Check that ``storage_dir`` is a storage directory and return its control file's path.

    Raises:
        FileNotFoundError: the directory does not exist.
        NotADirectoryError: the path is not a directory.
        StorageNotInitializedError: the directory holds no control file.
    """
    if not storage_dir.exists():
        raise FileNotFoundError(f"storage directory {storage_dir} does not exist")
    if not storage_dir.is_dir():
        raise NotADirectoryError(f"{storage_dir} is not a directory: give a storage directory")
    path = storage_dir / fmt.CONTROL_FILE_NAME
    if not path.is_file():
        raise StorageNotInitializedError(
            f"{storage_dir} is not a storage directory: it holds no {fmt.CONTROL_FILE_NAME} "
            "(a storage node creates it when it is added to a cluster)"
        )
    return path


def read_control_file(storage_dir: Path) -> ControlFileDump:
    """Read and decode the control file of a storage directory (docs/design/storage.md "Control file").

    Structs and fence slots that fail their CRC are reported as such, not raised. The current
    struct and the fence are chosen by ``control_file.current_struct`` and ``current_fence``, the
    rules a storage node applies when it opens the file.

    Raises:
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError: see
            :func:`require_storage_directory`.
        CorruptDataError: the header is invalid or the file is shorter than its header says.
    """
    path = require_storage_directory(storage_dir)
    data = path.read_bytes()
    header, decoded = fmt.decode_control_file(data, str(path))
    partitions = []
    for entry in decoded:
        pid, stored_pid = entry.partition_id, entry.stored_partition_id
        structs = [
            PartitionInfoStruct(i, offset, info)
            for i, (offset, info) in enumerate(zip(entry.struct_offsets, entry.structs, strict=True))
        ]
        slots = [
            FenceSlot(i, offset, fence)
            for i, (offset, fence) in enumerate(zip(entry.fence_offsets, entry.fences, strict=True))
        ]
        chosen = current_struct([s.info for s in structs])
        fence, _slot = current_fence([s.session_id for s in slots], None if chosen is None else chosen[0])
        partitions.append(
            ControlPartition(
                pid,
                fmt.partition_entry_offset(pid),
                stored_pid,
                (structs[0], structs[1]),
                None if chosen is None else chosen[1],
                (slots[0], slots[1]),
                fence,
            )
        )
    trailing = len(data) - fmt.control_file_size(header.num_partitions)
    return ControlFileDump(path, len(data), header, tuple(partitions), trailing)


# ---- segment data files ----


class StopKind(enum.Enum):
    """Why a record scan stopped."""

    END = "end of file"
    TORN_TAIL = "torn tail"
    CORRUPT = "corrupt record"


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A valid record (both CRCs checked) and where it lies in the data file."""

    offset: int
    size: int
    record: Record


@dataclass(frozen=True, slots=True)
class ScanStop:
    """Where and why a record scan stopped.

    Attributes:
        kind: END (clean end of file), TORN_TAIL (the bytes look like a torn tail: an incomplete
            record, or only zero bytes up to the end of the file), or CORRUPT (any other invalid
            record). A scan judges by the data file alone; start-up still treats a TORN_TAIL as
            corruption when :func:`later_record_indexed` says so (``segment.py``).
        offset: the end of the last valid record, where the invalid bytes (if any) begin.
        reason: why the bytes at ``offset`` are not a record (empty at END).
    """

    kind: StopKind
    offset: int
    reason: str


class SegmentFile:
    """A segment data file opened read-only; the header is decoded on opening.

    Args:
        path: the ``.seg`` file.
        chunk_size: bytes read per chunk while scanning.

    Raises:
        OSError: the file cannot be opened.
        CorruptDataError: the header is short or has an unknown format version.
    """

    def __init__(self, path: Path, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        self.path = path
        self.chunk_size = chunk_size
        self._fd: int | None = os.open(path, os.O_RDONLY)
        try:
            self.file_size = os.fstat(self._fd).st_size
            self.header = fmt.SegmentHeader.decode(os.pread(self._fd, fmt.HEADER_SIZE, 0), str(path))
        except BaseException:
            self.close()
            raise

    def pread(self, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        if self._fd is None:
            raise ValueError(f"segment file {self.path} is closed")
        return os.pread(self._fd, size, offset)

    def scan(self, start: int = fmt.HEADER_SIZE) -> RecordScan:
        """Return an iterator over the valid records from byte ``start`` on (see :class:`RecordScan`)."""
        return RecordScan(self, start)

    def record_at(self, offset: int) -> ScannedRecord | None:
        """Decode the record at ``offset``; None when there is no valid record there.

        The record must lie wholly inside the file and pass both CRCs; its transaction ID is not
        checked here.
        """
        if not fmt.HEADER_SIZE <= offset < self.file_size:
            return None
        head = self.pread(fmt.RECORD_HEADER_SIZE, offset)
        try:
            size = fmt.record_size(head)
            if offset + size > self.file_size:
                return None
            record, size = fmt.decode_record_at(head + self.pread(size - len(head), offset + len(head)), 0)
        except fmt.RecordProblem:
            return None
        return ScannedRecord(offset, size, record)

    def zeros_from(self, offset: int) -> bool:
        """Return True when every byte from ``offset`` to the end of the file is zero."""
        while offset < self.file_size:
            chunk = self.pread(self.chunk_size, offset)
            if not chunk:
                break  # the file shrank while we read it
            if chunk.count(0) != len(chunk):
                return False
            offset += len(chunk)
        return True

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SegmentFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordScan:
    """Iterator over the valid records of a segment data file, streamed in chunks.

    Transaction IDs are not checked here. When the iteration ends, :attr:`stop` says why.
    """

    def __init__(self, segment: SegmentFile, start: int) -> None:
        self._segment = segment
        self._position = start
        self._buffer = b""
        self._buffer_start = start
        self.stop: ScanStop | None = None

    def __iter__(self) -> RecordScan:
        return self

    def __next__(self) -> ScannedRecord:
        if self.stop is not None:
            raise StopIteration
        segment = self._segment
        while True:
            relative = self._position - self._buffer_start
            try:
                record, size = fmt.decode_record_at(self._buffer, relative)
            except fmt.RecordProblem as problem:
                loaded_end = self._buffer_start + len(self._buffer)
                more = b""
                if problem.incomplete and loaded_end < segment.file_size:
                    more = segment.pread(segment.chunk_size, loaded_end)
                if more:
                    self._buffer = self._buffer[relative:] + more
                    self._buffer_start = self._position
                    continue
                self.stop = self._stop_at(self._position, problem)
                raise StopIteration from None
            scanned = ScannedRecord(self._position, size, record)
            self._position += size
            return scanned

    def _stop_at(self, position: int, problem: fmt.RecordProblem) -> ScanStop:
        if position >= self._segment.file_size:
            return ScanStop(StopKind.END, position, "")
        if problem.incomplete or self._segment.zeros_from(position):
            return ScanStop(StopKind.TORN_TAIL, position, problem.reason)
        return ScanStop(StopKind.CORRUPT, position, problem.reason)


# ---- index files ----


class IndexFile:
    """A segment index file opened read-only.

    Attributes:
        header: the decoded header, None when it is short or has an unknown version.
        header_error: why the header did not decode ("" when it did).
        entry_count: the number of whole 8-byte entries after the header.
        partial_bytes: bytes after the last whole entry (0 in a healthy file).

    Raises:
        OSError: the file does not exist or cannot be opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY)
        size = os.fstat(self._fd).st_size
        self.header: fmt.SegmentHeader | None = None
        self.header_error = ""
        try:
            self.header = fmt.SegmentHeader.decode(os.pread(self._fd, fmt.HEADER_SIZE, 0), str(path))
        except CorruptDataError as exc:
            self.header_error = str(exc)
        body = max(0, size - fmt.HEADER_SIZE)
        self.entry_count = body // fmt.INDEX_ENTRY_SIZE
        self.partial_bytes = body % fmt.INDEX_ENTRY_SIZE
        self._cache_start = 0
        self._cache: list[int] = []

    @staticmethod
    def entry_offset(index: int) -> int:
        """Return the byte offset of entry ``index`` in an index file."""
        return fmt.HEADER_SIZE + index * fmt.INDEX_ENTRY_SIZE

    def belongs_to(self, header: fmt.SegmentHeader) -> bool:
        """Whether start-up would use this index for the data file whose header is ``header``.

        The index header must decode and name the same partition, cluster key and first
        transaction ID; otherwise start-up rebuilds the index from the data file.
        """
        mine = self.header
        return mine is not None and (mine.partition_id, mine.cluster_key, mine.first_transaction_id) == (
            header.partition_id,
            header.cluster_key,
            header.first_transaction_id,
        )

    def entry(self, index: int) -> int | None:
        """Return index entry ``index`` (a record offset), None beyond the last entry."""
        if not 0 <= index < self.entry_count:
            return None
        if not self._cache_start <= index < self._cache_start + len(self._cache):
            if self._fd is None:
                raise ValueError(f"index file {self.path} is closed")
            count = min(_INDEX_CHUNK_ENTRIES, self.entry_count - index)
            raw = os.pread(self._fd, count * fmt.INDEX_ENTRY_SIZE, self.entry_offset(index))
            self._cache_start, self._cache = index, fmt.decode_offsets(raw)
            if index >= self._cache_start + len(self._cache):
                return None  # the file shrank under us
        return self._cache[index - self._cache_start]

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_record_offset(segment: SegmentFile, transaction_id: int) -> int:
    """Return where to start scanning for ``transaction_id``: its record's offset or an earlier one.

    The offset comes from the index file when the index is usable and its entry points at that
    transaction's record; otherwise it is the first record's offset (scan and skip).
    """
    position = transaction_id - segment.header.first_transaction_id
    if position <= 0:
        return fmt.HEADER_SIZE
    try:
        index = IndexFile(segment.path.with_suffix(fmt.INDEX_SUFFIX))
    except OSError:
        return fmt.HEADER_SIZE
    with index:
        offset = index.entry(position) if index.header == segment.header else None
    found = None if offset is None else segment.record_at(offset)
    if found is None or found.record.transaction_id != transaction_id:
        return fmt.HEADER_SIZE
    return found.offset


def later_record_indexed(segment: SegmentFile, index: IndexFile, transaction_id: int, position: int) -> bool:
    """Whether the index proves that an invalid record which looks torn is not the tail.

    The rule of start-up (``Segment._recover`` and ``_later_record_indexed``, the torn tail rule of
    docs/format.md "Durability rules"): for each of the three transactions after ``transaction_id``
    that has an index entry, the entry must lie in the data file (at least 128, below its size) and
    after ``position``, and the record there must be whole, pass both CRCs and hold that
    transaction ID. One such record is enough; a damaged entry is skipped.

    Args:
        segment: the data file.
        index: its index file; the caller checks :meth:`IndexFile.belongs_to` (start-up rebuilds
            an index that does not belong, so it has no entries to consult).
        transaction_id: the transaction expected at ``position``.
        position: the offset of the invalid record.

    Returns:
        True when such a record exists: the invalid record is corruption, not a torn tail.
    """
    first = segment.header.first_transaction_id
    last = min(transaction_id + _TORN_TAIL_LOOKAHEAD, first + index.entry_count - 1)
    for candidate in range(transaction_id + 1, last + 1):
        offset = index.entry(candidate - first)
        if offset is None or not position < offset < segment.file_size:
            continue
        found = segment.record_at(offset)
        if found is not None and found.record.transaction_id == candidate:
            return True
    return False


def classify_stop(segment: SegmentFile, stop: ScanStop, transaction_id: int) -> ScanStop:
    """Return ``stop`` as start-up would classify it, consulting the segment's index file.

    A TORN_TAIL stop becomes CORRUPT when :func:`later_record_indexed` finds a valid record after
    it through the index, or :func:`~waltz.services.storage.format.record_follows` finds the next
    transaction's valid record in the bytes after it (a damaged length field made a record look
    incomplete); any other stop is returned unchanged.

    Args:
        segment: the data file the stop was found in.
        stop: where a scan of ``segment`` stopped.
        transaction_id: the transaction expected at ``stop.offset``.
    """
    if stop.kind is not StopKind.TORN_TAIL:
        return stop
    indexed = False
    try:
        with IndexFile(segment.path.with_suffix(fmt.INDEX_SUFFIX)) as index:
            if index.belongs_to(segment.header):
                indexed = later_record_indexed(segment, index, transaction_id, stop.offset)
    except OSError:
        pass
    if indexed:
        why = "the index points to a valid record after it"
    else:
        reach = min(segment.file_size, stop.offset + fmt.RESYNC_REACH) - stop.offset
        if not fmt.record_follows(segment.pread(reach, stop.offset), transaction_id + 1):
            return stop
        why = f"transaction {transaction_id + 1}'s valid record follows it"
    return ScanStop(StopKind.CORRUPT, stop.offset, f"{stop.reason}; {why}, so this is not a torn tail")
