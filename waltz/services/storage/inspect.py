"""Read-only inspection of a storage node's files: control file dump, record scans, verification.

Source: seed 000 "On Disk Data Structures"; ``docs/format.md``. Used by ``waltz disk`` and meant for
later tools (the Spark reader, chaos checks). Nothing here writes, truncates or creates a file:
files are opened read-only and segment files are streamed in chunks (a segment can be 1 GiB).
Every byte layout comes from :mod:`waltz.services.storage.format`.

The verifier judges files the way a storage node's start-up would (``segment.py``,
``partition.py``): what start-up repairs by itself (a torn tail of the last segment, index
entries after the last index checkpoint of the last segment, a missing index, an incomplete new
segment) is a WARNING; everything else is an ERROR.
"""

from __future__ import annotations

import enum
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from waltz.errors import CorruptDataError, StorageNotInitializedError
from waltz.protocol.records import Record
from waltz.services.storage import format as fmt
from waltz.services.storage.partition import DEFAULT_CHECKPOINT_INTERVAL

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ControlFileDump",
    "ControlPartition",
    "FenceSlot",
    "IndexFile",
    "PartitionInfoStruct",
    "PartitionReport",
    "PartitionSummary",
    "Problem",
    "RecordScan",
    "ScanStop",
    "ScannedRecord",
    "SegmentFile",
    "SegmentReport",
    "Severity",
    "StopKind",
    "StorageReport",
    "collect_stats",
    "find_record_offset",
    "read_control_file",
    "require_storage_directory",
    "verify_partition",
    "verify_segment",
    "verify_storage",
]

#: Bytes read per chunk when streaming a segment data file.
DEFAULT_CHUNK_SIZE: Final = 8 * 1024 * 1024
#: Index entries read per chunk.
_INDEX_CHUNK_ENTRIES: Final = 64 * 1024
#: First read when decoding a single record at an offset (grown until the record fits).
_PROBE_SIZE: Final = 64 * 1024
#: Records tried when looking for a valid record after a corrupt one.
_RESYNC_TRIES: Final = 16
#: Index mismatches reported one by one per segment; the rest are counted.
_MAX_INDEX_REPORTS: Final = 10


# ---- problems ----


class Severity(enum.Enum):
    """How bad a problem is: an ERROR fails verification, a WARNING is repaired at start-up."""

    ERROR = "ERROR"
    WARNING = "WARNING"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of the verifier.

    Attributes:
        severity: ERROR or WARNING.
        message: what is wrong, with the values involved.
        path: the file (or directory) concerned.
        partition_id: the partition, -1 when not known.
        offset: byte offset in ``path``, -1 when not applicable.
        transaction_id: the transaction involved, -1 when not known.
    """

    severity: Severity
    message: str
    path: Path
    partition_id: int = -1
    offset: int = -1
    transaction_id: int = -1

    def describe(self) -> str:
        """Return one human-readable line: severity, partition, file, offset, transaction, message."""
        where = [f"partition {self.partition_id}"] if self.partition_id >= 0 else []
        where.append(f"file {self.path}")
        if self.offset >= 0:
            where.append(f"offset {self.offset}")
        if self.transaction_id >= 0:
            where.append(f"transaction {self.transaction_id}")
        return f"{self.severity.value}: {', '.join(where)}: {self.message}"


@dataclass(slots=True)
class _Problems:
    """Collects problems about one file of one partition."""

    path: Path
    partition_id: int
    found: list[Problem] = field(default_factory=list)

    def add(self, severity: Severity, message: str, offset: int = -1, transaction_id: int = -1) -> None:
        self.found.append(Problem(severity, message, self.path, self.partition_id, offset, transaction_id))


def _count(problems: Sequence[Problem], severity: Severity) -> int:
    return sum(1 for p in problems if p.severity is severity)


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
    """Read and decode the control file of a storage directory (seed 000 "Control File").

    Structs and fence slots that fail their CRC are reported as such, not raised.

    Raises:
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError: see
            :func:`require_storage_directory`.
        CorruptDataError: the header is invalid or the file is shorter than its header says.
    """
    path = require_storage_directory(storage_dir)
    data = path.read_bytes()
    header = fmt.ControlFileHeader.decode(data, str(path))
    n = header.num_partitions
    fence_start = fmt.HEADER_SIZE + n * fmt.PARTITION_INFO_SIZE
    expected = fence_start + n * 2 * fmt.FENCE_SLOT_SIZE
    if len(data) < expected:
        raise CorruptDataError(
            f"control file is {len(data)} bytes, {n} partitions need {expected}", path=str(path)
        )
    partitions = []
    for pid in range(n):
        base = fmt.HEADER_SIZE + pid * fmt.PARTITION_INFO_SIZE
        stored_pid = fmt.decode_partition_id(data[base : base + 4])
        structs = []
        for i in range(2):
            start = base + 4 + i * fmt.PARTITION_INFO_STRUCT_SIZE
            raw = data[start : start + fmt.PARTITION_INFO_STRUCT_SIZE]
            info = fmt.decode_partition_info_struct(pid, raw) if stored_pid == pid else None
            structs.append(PartitionInfoStruct(i, start, info))
        slots = []
        for i in range(2):
            start = fence_start + (pid * 2 + i) * fmt.FENCE_SLOT_SIZE
            slots.append(
                FenceSlot(i, start, fmt.decode_fence_slot(pid, data[start : start + fmt.FENCE_SLOT_SIZE]))
            )
        # The same choice as ControlFile._entry: the highest valid struct (the first one on a tie),
        # and a fence of at least its session ID.
        valid = [(s.info, s.index) for s in structs if s.info is not None]
        fence = max([s.session_id for s in slots if s.session_id is not None], default=-1)
        current: int | None = None
        if valid:
            info, current = max(valid, key=lambda pair: pair[0])
            fence = max(fence, info.session_id)
        partitions.append(
            ControlPartition(
                pid, base, stored_pid, (structs[0], structs[1]), current, (slots[0], slots[1]), fence
            )
        )
    return ControlFileDump(path, len(data), header, tuple(partitions), len(data) - expected)


def _control_problems(dump: ControlFileDump, entry: ControlPartition) -> list[Problem]:
    out = _Problems(dump.path, entry.partition_id)
    corrupt = [s for s in entry.structs if s.info is None]
    if entry.stored_partition_id != entry.partition_id:
        out.add(
            Severity.ERROR,
            f"entry holds partition ID {entry.stored_partition_id}: the partition cannot open",
            entry.offset,
        )
    elif len(corrupt) == 2:
        out.add(
            Severity.ERROR,
            "both partition-info structs fail their CRC: the partition cannot open",
            entry.offset,
        )
    elif corrupt:
        out.add(
            Severity.WARNING,
            f"partition-info struct {corrupt[0].index} fails its CRC; struct {1 - corrupt[0].index} is used "
            "(the partition rolls back to it)",
            corrupt[0].offset,
        )
    bad_slots = [s for s in entry.fence_slots if s.session_id is None]
    if len(bad_slots) == 2:
        out.add(
            Severity.ERROR,
            "both fence slots fail their CRC: the fence falls back to the last session ID "
            f"{entry.fence}, so an older writer may not be fenced",
            bad_slots[0].offset,
        )
    elif bad_slots:
        out.add(Severity.WARNING, f"fence slot {bad_slots[0].index} fails its CRC", bad_slots[0].offset)
    return out.found


# ---- segment files ----


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
        kind: END (clean end of file), TORN_TAIL (an incomplete record or only zero bytes up to the
            end of the file, the rule of ``segment.py``), or CORRUPT (any other invalid record).
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
        """Decode the record at ``offset``; None when there is no valid record there."""
        if not fmt.HEADER_SIZE <= offset < self.file_size:
            return None
        size = _PROBE_SIZE
        while True:
            raw = self.pread(size, offset)
            try:
                record, length = fmt.decode_record_at(raw, 0)
            except fmt.RecordProblem as problem:
                if problem.incomplete and offset + len(raw) < self.file_size:
                    size *= 4
                    continue
                return None
            return ScannedRecord(offset, length, record)

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

    def entry(self, index: int) -> int | None:
        """Return index entry ``index`` (a record offset), None beyond the last entry."""
        if not 0 <= index < self.entry_count:
            return None
        if not self._cache_start <= index < self._cache_start + len(self._cache):
            if self._fd is None:
                raise ValueError(f"index file {self.path} is closed")
            count = min(_INDEX_CHUNK_ENTRIES, self.entry_count - index)
            raw = os.pread(
                self._fd, count * fmt.INDEX_ENTRY_SIZE, fmt.HEADER_SIZE + index * fmt.INDEX_ENTRY_SIZE
            )
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


# ---- verification ----


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """What :func:`verify_segment` found in one segment.

    Attributes:
        path: the data file.
        header: its header, None when it does not decode.
        is_last: whether it was judged as the partition's last segment (recovered at start-up).
        file_size: the data file's size in bytes.
        records: valid records.
        transactions: transaction IDs the segment covers: valid records plus unreadable ones that
            were skipped with the help of the index.
        record_bytes: bytes taken by the valid records (headers, data and CRCs).
        data_bytes: bytes of transaction data in the valid records.
        valid_end: the offset just after the last valid record.
        index_entries: entries in the index file (0 when it is missing or invalid).
        complete: the scan reached the end of the file (or a torn tail) rather than stopping at an
            unreadable record.
        problems: what is wrong, in file order.
    """

    path: Path
    header: fmt.SegmentHeader | None
    is_last: bool
    file_size: int
    records: int = 0
    transactions: int = 0
    record_bytes: int = 0
    data_bytes: int = 0
    valid_end: int = 0
    index_entries: int = 0
    complete: bool = False
    problems: tuple[Problem, ...] = ()

    @property
    def first_transaction_id(self) -> int:
        """The first transaction ID of the header (-1 without a header)."""
        return -1 if self.header is None else self.header.first_transaction_id

    @property
    def max_transaction_id(self) -> int:
        """The last transaction ID the segment covers (first - 1 when empty)."""
        return self.first_transaction_id + self.transactions - 1

    @property
    def errors(self) -> int:
        """The number of ERROR problems."""
        return _count(self.problems, Severity.ERROR)


@dataclass(slots=True)
class _ScanState:
    """Running totals of one segment's verification."""

    expected: int = 0  # index of the next transaction within the segment
    records: int = 0
    record_bytes: int = 0
    data_bytes: int = 0
    valid_end: int = fmt.HEADER_SIZE
    index_errors: int = 0
    index_warnings: int = 0


def verify_segment(
    path: Path,
    *,
    partition_id: int | None = None,
    cluster_key: uuid.UUID | None = None,
    is_last: bool = True,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> SegmentReport:
    """Verify one segment (data file and index file), streaming through both.

    Checks: the header decodes and matches ``partition_id``, ``cluster_key`` and the file name;
    every record passes its record and data CRC; transaction IDs run consecutively from the
    header's first ID; each index entry equals its record's offset; the index has one entry per
    record; nothing follows the last valid record. After a corrupt record the scan resumes at the
    next record the index points to, so that one bad record does not hide the rest.

    Args:
        path: the ``.seg`` file.
        partition_id: the partition it must belong to (None: not checked).
        cluster_key: the cluster key it must carry (None: not checked).
        is_last: judge it as the last segment of its partition, whose torn tail and index after
            the last checkpoint start-up repairs (WARNINGs); elsewhere they are ERRORs.
        checkpoint_interval: transactions between index flushes (storage.index.checkpointInterval).
        chunk_size: bytes read per chunk.

    Returns:
        The report; it never raises for what it finds in the files.
    """
    out = _Problems(path, -1 if partition_id is None else partition_id)
    try:
        segment = SegmentFile(path, chunk_size=chunk_size)
    except (OSError, CorruptDataError) as exc:
        out.add(Severity.ERROR, f"cannot read the segment header: {exc}", 0)
        size = path.stat().st_size if path.is_file() else 0
        return SegmentReport(path, None, is_last, size, problems=tuple(out.found))
    with segment:
        header = segment.header
        out.partition_id = header.partition_id if partition_id is None else partition_id
        first = header.first_transaction_id
        if partition_id is not None and header.partition_id != partition_id:
            out.add(
                Severity.ERROR, f"header says partition {header.partition_id}, expected {partition_id}", 0
            )
        if cluster_key is not None and header.cluster_key != cluster_key:
            out.add(
                Severity.ERROR, f"header says cluster key {header.cluster_key}, expected {cluster_key}", 0
            )
        expected_name = fmt.segment_file_name(first, fmt.SEGMENT_SUFFIX)
        if path.name != expected_name:
            out.add(
                Severity.ERROR,
                f"header says first transaction {first}, so the file should be {expected_name}",
                0,
            )
        index = _open_index(path.with_suffix(fmt.INDEX_SUFFIX), header, out)
        try:
            state, complete = _scan_segment(segment, index, out, is_last, checkpoint_interval)
            if index is not None:
                _check_index_size(index, state, complete, is_last, out)
        finally:
            if index is not None:
                index.close()
        return SegmentReport(
            path,
            header,
            is_last,
            segment.file_size,
            state.records,
            state.expected,
            state.record_bytes,
            state.data_bytes,
            state.valid_end,
            0 if index is None else index.entry_count,
            complete,
            tuple(out.found),
        )


def _open_index(path: Path, header: fmt.SegmentHeader, out: _Problems) -> IndexFile | None:
    repaired = "; start-up rebuilds the index from the data file"
    try:
        index = IndexFile(path)
    except OSError as exc:
        _Problems(path, out.partition_id, out.found).add(
            Severity.WARNING, f"index file missing: {exc}{repaired}"
        )
        return None
    wrong = index.header_error
    if index.header is not None and (
        index.header.partition_id,
        index.header.cluster_key,
        index.header.first_transaction_id,
    ) != (header.partition_id, header.cluster_key, header.first_transaction_id):
        wrong = "its header differs from the data file's (partition, cluster key or first transaction)"
    if wrong:
        index.close()
        _Problems(path, out.partition_id, out.found).add(
            Severity.WARNING, f"index unusable: {wrong}{repaired}", 0
        )
        return None
    return index


def _trusted_entries(segment: SegmentFile, index: IndexFile, interval: int) -> int:
    """Index entries start-up trusts in the last segment: up to the last usable checkpoint."""
    first = segment.header.first_transaction_id
    trusted = (index.entry_count // interval) * interval
    while trusted > 0:
        offset = index.entry(trusted - 1)
        found = None if offset is None else segment.record_at(offset)
        if found is not None and found.record.transaction_id == first + trusted - 1:
            return trusted
        trusted -= interval
    return 0


def _scan_segment(
    segment: SegmentFile, index: IndexFile | None, out: _Problems, is_last: bool, interval: int
) -> tuple[_ScanState, bool]:
    """Check every record and index entry; return the totals and whether the scan completed."""
    first = segment.header.first_transaction_id
    trusted = 0
    if index is not None:
        trusted = _trusted_entries(segment, index, interval) if is_last else index.entry_count
    state = _ScanState()
    position = fmt.HEADER_SIZE
    while True:
        scan = segment.scan(position)
        stop: ScanStop | None = None
        for item in scan:
            transaction_id = first + state.expected
            if item.record.transaction_id != transaction_id:
                reason = f"record holds transaction {item.record.transaction_id}, expected {transaction_id}"
                stop = ScanStop(StopKind.CORRUPT, item.offset, reason)
                break
            if index is not None:
                _check_entry(index, state, item.offset, transaction_id, trusted, out)
            state.expected += 1
            state.records += 1
            state.record_bytes += item.size
            state.data_bytes += len(item.record.data)
            state.valid_end = item.offset + item.size
        stop = stop or scan.stop
        assert stop is not None  # the scan ran to its end or we broke out with a stop
        if stop.kind is StopKind.END:
            break
        resume = _resync(segment, index, first, state.expected, stop.offset)
        if stop.kind is StopKind.TORN_TAIL and resume is None:
            _report_tail(segment, stop, first + state.expected, is_last, out)
            break
        if resume is None:
            message = (
                f"corrupt record: {stop.reason}; no valid record found after it, so the rest of the "
                f"segment ({segment.file_size - stop.offset} bytes) cannot be checked"
            )
            out.add(Severity.ERROR, message, stop.offset, first + state.expected)
            _report_index_overflow(index, state, out)
            return state, False
        skip_to, offset = resume
        span = f"transaction {first + state.expected}"
        if skip_to - state.expected > 1:
            span = f"transactions {first + state.expected} to {first + skip_to - 1}"
        message = (
            f"corrupt record: {stop.reason}; {span} ({offset - stop.offset} bytes) cannot be read; "
            f"the scan resumes at offset {offset} (found through the index)"
        )
        if stop.kind is StopKind.TORN_TAIL:
            message += (
                ". Valid records follow, so this is corruption, not a torn tail, yet start-up would cut "
                "it and every record after it as a torn tail"
            )
        out.add(Severity.ERROR, message, stop.offset, first + state.expected)
        state.expected = skip_to
        position = offset
    _report_index_overflow(index, state, out)
    return state, True


def _report_tail(segment: SegmentFile, stop: ScanStop, next_id: int, is_last: bool, out: _Problems) -> None:
    tail = segment.file_size - stop.offset
    if is_last:
        message = f"torn tail: {tail} bytes after the last valid record ({stop.reason}); start-up cuts it"
        out.add(Severity.WARNING, message, stop.offset, next_id)
    else:
        message = (
            f"{tail} bytes after the last valid record of a sealed segment ({stop.reason}); "
            "start-up only cuts a torn tail of the last segment"
        )
        out.add(Severity.ERROR, message, stop.offset, next_id)


def _check_entry(
    index: IndexFile, state: _ScanState, offset: int, transaction_id: int, trusted: int, out: _Problems
) -> None:
    entry = index.entry(state.expected)
    if entry is None or entry == offset:
        return  # a missing entry is reported by the count check
    message = f"index entry {state.expected} holds offset {entry}, the record is at offset {offset}"
    if state.expected < trusted:
        severity = Severity.ERROR
        state.index_errors += 1
        reported = state.index_errors
    else:
        severity = Severity.WARNING
        message += "; start-up rebuilds the index after its last checkpoint"
        state.index_warnings += 1
        reported = state.index_warnings
    if reported <= _MAX_INDEX_REPORTS:
        entry_offset = fmt.HEADER_SIZE + state.expected * fmt.INDEX_ENTRY_SIZE
        _Problems(index.path, out.partition_id, out.found).add(
            severity, message, entry_offset, transaction_id
        )


def _report_index_overflow(index: IndexFile | None, state: _ScanState, out: _Problems) -> None:
    if index is None:
        return
    for severity, total in ((Severity.ERROR, state.index_errors), (Severity.WARNING, state.index_warnings)):
        if total > _MAX_INDEX_REPORTS:
            message = f"{total - _MAX_INDEX_REPORTS} more index entries differ from their record's offset"
            _Problems(index.path, out.partition_id, out.found).add(severity, message)


def _resync(
    segment: SegmentFile, index: IndexFile | None, first: int, expected: int, bad_offset: int
) -> tuple[int, int] | None:
    """Find the next record after a corrupt one through the index: (its index, its offset)."""
    if index is None:
        return None
    tries = 0
    candidate = expected + 1
    while candidate < index.entry_count and tries < _RESYNC_TRIES:
        offset = index.entry(candidate)
        if offset is not None and bad_offset < offset < segment.file_size:
            tries += 1
            found = segment.record_at(offset)
            if found is not None and found.record.transaction_id == first + candidate:
                return candidate, offset
        candidate += 1
    return None


def _check_index_size(
    index: IndexFile, state: _ScanState, complete: bool, is_last: bool, out: _Problems
) -> None:
    severity, repaired = Severity.ERROR, ""
    if is_last:
        severity, repaired = Severity.WARNING, "; start-up rebuilds the index after its last checkpoint"
    problems = _Problems(index.path, out.partition_id, out.found)
    end = fmt.HEADER_SIZE + index.entry_count * fmt.INDEX_ENTRY_SIZE
    if index.partial_bytes:
        problems.add(severity, f"{index.partial_bytes} bytes after the last whole index entry{repaired}", end)
    if complete and index.entry_count != state.expected:
        first = index.header.first_transaction_id if index.header is not None else 0
        records = f"{state.expected} record" + ("" if state.expected == 1 else "s")
        message = f"index has {index.entry_count} entries, the segment has {records}{repaired}"
        at = min(index.entry_count, state.expected)
        problems.add(severity, message, fmt.HEADER_SIZE + at * fmt.INDEX_ENTRY_SIZE, first + at)


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What :func:`verify_partition` found in one partition directory.

    Attributes:
        partition_id: the partition.
        directory: its directory.
        segments: one report per segment, in transaction order.
        problems: every problem of the partition (its control file entry, its directory and its
            segments), in the order found.
    """

    partition_id: int
    directory: Path
    segments: tuple[SegmentReport, ...]
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> int:
        """The number of ERROR problems."""
        return _count(self.problems, Severity.ERROR)

    @property
    def warnings(self) -> int:
        """The number of WARNING problems."""
        return _count(self.problems, Severity.WARNING)

    @property
    def passed(self) -> bool:
        """True when no ERROR was found."""
        return self.errors == 0


def _segment_paths(directory: Path, partition_id: int, out: list[Problem]) -> list[Path]:
    paths = sorted(directory.glob("*" + fmt.SEGMENT_SUFFIX))
    for index_path in sorted(directory.glob("*" + fmt.INDEX_SUFFIX)):
        if not index_path.with_suffix(fmt.SEGMENT_SUFFIX).exists():
            message = (
                "index file without a data file; start-up ignores it, but a new segment with this first "
                "transaction ID cannot be created while it exists"
            )
            out.append(Problem(Severity.WARNING, message, index_path, partition_id))
    if len(paths) > 1 and paths[-1].stat().st_size <= fmt.HEADER_SIZE:
        try:
            with SegmentFile(paths[-1]):
                pass
        except (OSError, CorruptDataError) as exc:
            message = f"incomplete new segment ({exc}); start-up removes it"
            out.append(Problem(Severity.WARNING, message, paths[-1], partition_id, 0))
            paths.pop()
    return paths


def _chain_problems(previous: SegmentReport | None, report: SegmentReport, pid: int) -> list[Problem]:
    """Check that ``report``'s segment starts where ``previous`` ends (and the first one at 0)."""
    if report.header is None:
        return []
    first = report.first_transaction_id
    if previous is None:
        if first == 0:
            return []
        message = f"the first segment starts at transaction {first}, not 0"
        return [Problem(Severity.WARNING, message, report.path, pid, 0, 0)]
    if previous.header is None or not previous.complete or first == previous.max_transaction_id + 1:
        return []  # an unreadable previous segment has been reported already
    message = (
        f"segment chain broken: {previous.path.name} ends at transaction "
        f"{previous.max_transaction_id}, this segment starts at {first}"
    )
    return [Problem(Severity.ERROR, message, report.path, pid, 0, previous.max_transaction_id + 1)]


def verify_partition(
    directory: Path,
    partition_id: int,
    *,
    cluster_key: uuid.UUID | None = None,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> PartitionReport:
    """Verify every segment of a partition directory and that the segments chain.

    Args:
        directory: the partition directory (``<storage directory>/<partition id>``).
        partition_id: the partition it holds.
        cluster_key: the cluster key every segment must carry (None: not checked).
        checkpoint_interval: transactions between index flushes.
        chunk_size: bytes read per chunk.

    Returns:
        The report, with the problems of every segment.
    """
    problems: list[Problem] = []
    paths = _segment_paths(directory, partition_id, problems)
    if not paths:
        message = "no segment files; start-up creates the first segment"
        problems.append(Problem(Severity.WARNING, message, directory, partition_id))
    segments: list[SegmentReport] = []
    for i, path in enumerate(paths):
        report = verify_segment(
            path,
            partition_id=partition_id,
            cluster_key=cluster_key,
            is_last=i == len(paths) - 1,
            checkpoint_interval=checkpoint_interval,
            chunk_size=chunk_size,
        )
        problems.extend(report.problems)
        problems.extend(_chain_problems(segments[-1] if segments else None, report, partition_id))
        segments.append(report)
    return PartitionReport(partition_id, directory, tuple(segments), tuple(problems))


@dataclass(frozen=True, slots=True)
class StorageReport:
    """What :func:`verify_storage` found in a storage directory.

    Attributes:
        directory: the storage directory.
        control: the decoded control file.
        partitions: one report per verified partition, by partition ID.
        problems: problems outside the verified partitions (control file, stray directories).
    """

    directory: Path
    control: ControlFileDump
    partitions: tuple[PartitionReport, ...]
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> int:
        """The number of ERROR problems, in partitions and outside them."""
        return _count(self.problems, Severity.ERROR) + sum(p.errors for p in self.partitions)

    @property
    def warnings(self) -> int:
        """The number of WARNING problems, in partitions and outside them."""
        return _count(self.problems, Severity.WARNING) + sum(p.warnings for p in self.partitions)

    @property
    def passed(self) -> bool:
        """True when no ERROR was found."""
        return self.errors == 0


def verify_storage(
    storage_dir: Path,
    partitions: Sequence[int] | None = None,
    *,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> StorageReport:
    """Verify the control file and every (or the given) partition of a storage directory.

    Args:
        storage_dir: the storage directory.
        partitions: partition IDs to verify; None verifies every partition directory present.
        checkpoint_interval: transactions between index flushes (storage.index.checkpointInterval).
        chunk_size: bytes read per chunk.

    Returns:
        The report; problems found in files are reported, not raised.

    Raises:
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError, CorruptDataError: the
            directory is not a readable storage directory (see :func:`read_control_file`).
    """
    control = read_control_file(storage_dir)
    outside: list[Problem] = []
    if control.trailing_bytes:
        message = f"{control.trailing_bytes} unexpected bytes after the fence section"
        outside.append(
            Problem(Severity.WARNING, message, control.path, -1, control.size - control.trailing_bytes)
        )
    present: dict[int, Path] = {}
    for child in sorted(storage_dir.iterdir()):
        if child.is_dir() and child.name.isascii() and child.name.isdigit():
            present[int(child.name)] = child
    n = control.header.num_partitions
    selected = sorted(set(partitions)) if partitions is not None else sorted(present)
    reports: list[PartitionReport] = []
    for pid in selected:
        directory = present.get(pid, storage_dir / str(pid))
        if not 0 <= pid < n:
            message = f"partition {pid} is out of range: the cluster has {n} partitions; the node ignores it"
            severity = Severity.WARNING if partitions is None else Severity.ERROR
            outside.append(Problem(severity, message, directory, pid))
            continue
        if pid not in present:
            message = "no partition directory: the partition is not assigned to this storage node"
            outside.append(Problem(Severity.ERROR, message, directory, pid))
            continue
        report = verify_partition(
            directory,
            pid,
            cluster_key=control.header.cluster_key,
            checkpoint_interval=checkpoint_interval,
            chunk_size=chunk_size,
        )
        own = _control_problems(control, control.partitions[pid])
        reports.append(PartitionReport(pid, directory, report.segments, (*own, *report.problems)))
    if partitions is None:
        for entry in control.partitions:
            if entry.partition_id not in present:
                outside.extend(_control_problems(control, entry))
    return StorageReport(storage_dir, control, tuple(reports), tuple(outside))


# ---- statistics ----


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """Statistics of one partition (``waltz disk stats``).

    Attributes:
        partition_id: the partition.
        segments: segment files.
        records: valid records.
        record_bytes: bytes of the valid records on disk (what ``PartitionStats.data_bytes`` counts).
        data_bytes: bytes of transaction data in the valid records.
        first_transaction_id: the first segment's first transaction ID (0 without segments).
        max_transaction_id: the last transaction ID stored (-1 when empty).
        info: the current partition info of the control file (None when both structs are corrupt).
        fence: the effective fence session ID.
        errors: ERROR problems found while reading (see ``waltz disk verify``).
        warnings: WARNING problems found while reading.
    """

    partition_id: int
    segments: int
    records: int
    record_bytes: int
    data_bytes: int
    first_transaction_id: int
    max_transaction_id: int
    info: fmt.PartitionInfo | None
    fence: int
    errors: int
    warnings: int


def collect_stats(
    storage_dir: Path,
    partitions: Sequence[int] | None = None,
    *,
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[PartitionSummary]:
    """Return the statistics of every (or the given) partition of a storage directory.

    Every record is read and checked, as by :func:`verify_storage`, so the numbers are exact.

    Raises:
        FileNotFoundError, NotADirectoryError, StorageNotInitializedError, CorruptDataError: see
            :func:`verify_storage`.
    """
    report = verify_storage(
        storage_dir, partitions, checkpoint_interval=checkpoint_interval, chunk_size=chunk_size
    )
    summaries = []
    for partition in report.partitions:
        segments = partition.segments
        entry = report.control.partitions[partition.partition_id]
        summaries.append(
            PartitionSummary(
                partition.partition_id,
                len(segments),
                sum(s.records for s in segments),
                sum(s.record_bytes for s in segments),
                sum(s.data_bytes for s in segments),
                segments[0].first_transaction_id if segments else 0,
                segments[-1].max_transaction_id if segments else -1,
                entry.info,
                entry.fence,
                partition.errors,
                partition.warnings,
            )
        )
    return summaries
