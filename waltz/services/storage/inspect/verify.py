"""Checking a storage node's files: verify segments, partitions and a storage directory.

Design: docs/design/storage.md "Files on disk", "Start-up checks and torn tails";
``docs/format.md``. Read-only, like :mod:`waltz.services.storage.inspect.reader`, which does all
the reading.

The verifier judges files the way a storage node's start-up would (``segment.py``,
``partition.py``, ``node.py``): what start-up repairs by itself (a torn tail of the last segment,
index entries after the last index checkpoint of the last segment, a missing index, an incomplete
new segment) is a WARNING; everything else is an ERROR. Whether invalid bytes are a torn tail or
corruption follows start-up's rule (:func:`~waltz.services.storage.inspect.reader.later_record_indexed`,
:func:`~waltz.services.storage.format.record_follows`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from waltz.errors import CorruptDataError
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import UNRECOVERABLE_REPLICA, held_records_lost
from waltz.services.storage.inspect.reader import (
    DEFAULT_CHUNK_SIZE,
    ControlFileDump,
    ControlPartition,
    IndexFile,
    ScanStop,
    SegmentFile,
    StopKind,
    later_record_indexed,
    read_control_file,
)
from waltz.services.storage.inspect.report import (
    PartitionReport,
    Problem,
    SegmentReport,
    Severity,
    StorageReport,
)
from waltz.services.storage.retention_file import RETENTION_FILE, RetentionRecord, read_retention_file
from waltz.services.storage.segment_chain import first_id_of
from waltz.services.storage.storage_partition import DEFAULT_CHECKPOINT_INTERVAL

__all__ = ["verify_partition", "verify_segment", "verify_storage"]

#: Records tried when looking for a valid record after a corrupt one.
_RESYNC_TRIES: Final = 16
#: Index mismatches reported one by one per segment; the rest are counted.
_MAX_INDEX_REPORTS: Final = 10


@dataclass(slots=True)
class _Problems:
    """Collects problems about one file of one partition."""

    path: Path
    partition_id: int
    found: list[Problem] = field(default_factory=list)

    def add(self, severity: Severity, message: str, offset: int = -1, transaction_id: int = -1) -> None:
        self.found.append(Problem(severity, message, self.path, self.partition_id, offset, transaction_id))


# ---- control file ----


def _held_below_local_low_water_mark(entry: ControlPartition, report: PartitionReport) -> list[Problem]:
    """An ERROR when the partition's records, once start-up has cut a torn tail, end below the
    control file's local low-water mark: acknowledged, committed records lost on this replica
    (:func:`~waltz.services.storage.control_file.held_records_lost`; docs/design/storage.md
    "Start-up checks and torn tails").

    A partition without a segment (all gone, or only an incomplete new one start-up removes) ends
    where start-up creates its first segment: at the removed segment's first transaction, else 0.
    """
    info = entry.info
    if info is None:
        return []  # both structs corrupt: reported by the control file's checks
    if not report.segments:
        left = sorted(report.directory.glob("*" + fmt.SEGMENT_SUFFIX))
        end = (first_id_of(left[-1]) if left else 0) - 1
        lost = held_records_lost(end, info)
        if lost is None:
            return []
        return [Problem(Severity.ERROR, lost, report.directory, entry.partition_id, -1, end + 1)]
    if report.segments[-1].header is None:
        return []  # no readable last segment: reported by its own checks
    last = report.segments[-1]
    lost = held_records_lost(last.max_transaction_id, info)
    if lost is None:
        return []
    return [
        Problem(
            Severity.ERROR, lost, last.path, entry.partition_id, last.valid_end, last.max_transaction_id + 1
        )
    ]


def _control_problems(dump: ControlFileDump, entry: ControlPartition) -> list[Problem]:
    out = _Problems(dump.path, entry.partition_id)
    corrupt = [s for s in entry.structs if s.info is None]
    if entry.stored_partition_id != entry.partition_id:
        out.add(
            Severity.ERROR,
            f"entry holds partition ID {entry.stored_partition_id}: {UNRECOVERABLE_REPLICA}",
            entry.offset,
        )
    elif len(corrupt) == 2:
        out.add(
            Severity.ERROR,
            f"both partition-info structs fail their CRC: {UNRECOVERABLE_REPLICA}",
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


# ---- segments ----


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


def _header_mismatches(
    header: fmt.SegmentHeader, path: Path, partition_id: int | None, cluster_key: uuid.UUID | None
) -> list[str]:
    """What in a segment header contradicts its partition, cluster and file name (``Segment.open``)."""
    found = []
    if partition_id is not None and header.partition_id != partition_id:
        found.append(f"header says partition {header.partition_id}, expected {partition_id}")
    if cluster_key is not None and header.cluster_key != cluster_key:
        found.append(
            f"header says the cluster key with fingerprint {cluster_key_fingerprint(header.cluster_key)}, "
            f"expected {cluster_key_fingerprint(cluster_key)}"
        )
    expected_name = fmt.segment_file_name(header.first_transaction_id, fmt.SEGMENT_SUFFIX)
    if path.name != expected_name:
        found.append(
            f"header says first transaction {header.first_transaction_id}, so the file should be "
            f"{expected_name}"
        )
    return found


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
        for message in _header_mismatches(header, path, partition_id, cluster_key):
            out.add(Severity.ERROR, message, 0)
        index = _open_index(path.with_suffix(fmt.INDEX_SUFFIX), header, out)
        try:
            state, complete = _scan_segment(segment, index, out, is_last, checkpoint_interval)
            if index is not None:
                _check_index_size(index, state, complete, is_last, out)
                if is_last:
                    _check_lost_records(segment, index, state, checkpoint_interval, out)
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
    if not wrong and not index.belongs_to(header):
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
        if _is_torn_tail(segment, index, stop, state.expected, trusted, is_last, resume):
            _report_tail(segment, stop, first + state.expected, is_last, resume, out)
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
                ". Valid records follow, so this is corruption, not a torn tail: start-up does not cut it"
            )
        out.add(Severity.ERROR, message, stop.offset, first + state.expected)
        state.expected = skip_to
        position = offset
    _report_index_overflow(index, state, out)
    return state, True


def _is_torn_tail(
    segment: SegmentFile,
    index: IndexFile | None,
    stop: ScanStop,
    expected: int,
    trusted: int,
    is_last: bool,
    resume: tuple[int, int] | None,
) -> bool:
    """Whether start-up would cut the bytes at ``stop`` as a torn tail (``Segment._recover``).

    ``expected`` is the index within the segment of the transaction expected at the stop.
    """
    if stop.kind is not StopKind.TORN_TAIL:
        return False
    if not is_last:
        # Start-up does not scan a sealed segment: only bytes with no valid record after them are
        # a tail (an ERROR there all the same); anything else is corruption.
        return resume is None
    if expected < trusted:
        return False  # start-up trusts the index up to its last checkpoint and never scans there
    first = segment.header.first_transaction_id
    if index is not None and later_record_indexed(segment, index, first + expected, stop.offset):
        return False
    reach = min(segment.file_size, stop.offset + fmt.RESYNC_REACH) - stop.offset
    return not fmt.record_follows(segment.pread(reach, stop.offset), first + expected + 1)


def _report_tail(
    segment: SegmentFile,
    stop: ScanStop,
    next_id: int,
    is_last: bool,
    resume: tuple[int, int] | None,
    out: _Problems,
) -> None:
    tail = segment.file_size - stop.offset
    if is_last:
        message = f"torn tail: {tail} bytes after the last valid record ({stop.reason}); start-up cuts it"
        if resume is not None:
            first = segment.header.first_transaction_id
            message += (
                f", with the valid record of transaction {first + resume[0]} the index points to at "
                f"offset {resume[1]} (start-up only looks for one among the next 3 transactions)"
            )
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
        _Problems(index.path, out.partition_id, out.found).add(
            severity, message, index.entry_offset(state.expected), transaction_id
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


def _check_lost_records(
    segment: SegmentFile, index: IndexFile, state: _ScanState, interval: int, out: _Problems
) -> None:
    """An ERROR when an index checkpoint of the last segment lies beyond the end of its data file,
    following the entry before it: the data is flushed before each checkpoint, so the records it
    and the index after it list were flushed and are lost; start-up logs the same as an error
    (docs/design/storage.md, "Start-up checks and torn tails")."""
    checkpoint = (index.entry_count // interval) * interval
    while checkpoint > 0:
        offset = index.entry(checkpoint - 1)
        previous = index.entry(checkpoint - 2) if checkpoint > 1 else None
        readable = checkpoint == 1 or previous is not None
        if offset is not None and readable and fmt.checkpoint_written(offset, previous):
            if offset >= segment.file_size and state.expected < index.entry_count:
                first = segment.header.first_transaction_id
                _Problems(index.path, out.partition_id, out.found).add(
                    Severity.ERROR,
                    f"transactions {first + state.expected} to {first + index.entry_count - 1} are "
                    f"lost: index checkpoint entry {checkpoint - 1} holds offset {offset}, beyond the "
                    f"end of the data file ({segment.file_size} bytes), and the data is flushed before "
                    "each checkpoint; start-up cuts them from the index (keeping it as "
                    f"{fmt.lost_index_name(index.path.name, first + state.expected)}). Restore the "
                    "data file from a "
                    "backup, or let the cluster's recovery copy them back from other replicas",
                    index.entry_offset(checkpoint - 1),
                    first + checkpoint - 1,
                )
            return
        checkpoint -= interval


def _check_index_size(
    index: IndexFile, state: _ScanState, complete: bool, is_last: bool, out: _Problems
) -> None:
    severity, repaired = Severity.ERROR, ""
    if is_last:
        severity, repaired = Severity.WARNING, "; start-up rebuilds the index after its last checkpoint"
    problems = _Problems(index.path, out.partition_id, out.found)
    end = index.entry_offset(index.entry_count)
    if index.partial_bytes:
        problems.add(severity, f"{index.partial_bytes} bytes after the last whole index entry{repaired}", end)
    if complete and index.entry_count != state.expected:
        first = index.header.first_transaction_id if index.header is not None else 0
        records = f"{state.expected} record" + ("" if state.expected == 1 else "s")
        message = f"index has {index.entry_count} entries, the segment has {records}{repaired}"
        at = min(index.entry_count, state.expected)
        problems.add(severity, message, index.entry_offset(at), first + at)


# ---- partitions ----


def _segment_paths(
    directory: Path, partition_id: int, cluster_key: uuid.UUID | None, out: list[Problem]
) -> list[Path]:
    paths = sorted(directory.glob("*" + fmt.SEGMENT_SUFFIX))
    for index_path in sorted(directory.glob("*" + fmt.INDEX_SUFFIX)):
        if not index_path.with_suffix(fmt.SEGMENT_SUFFIX).exists():
            message = (
                "index file without a data file; start-up ignores it, and removes it when it creates "
                "a segment with this first transaction ID"
            )
            out.append(Problem(Severity.WARNING, message, index_path, partition_id))
    for kept in sorted(directory.glob("*" + fmt.INDEX_SUFFIX + fmt.LOST_INDEX_MARK + "*")):
        first_lost = kept.name.rpartition(fmt.LOST_INDEX_MARK)[2]
        message = (
            f"start-up found transactions from {first_lost} on, which this kept "
            "index lists and whose data had been flushed, missing from the data file: they were "
            "lost. Restore them from a backup or let the cluster's recovery copy them back from "
            "other replicas, then remove this file"
        )
        out.append(Problem(Severity.ERROR, message, kept, partition_id))
    if paths and paths[-1].stat().st_size <= fmt.HEADER_SIZE:
        # As segment_chain.open_segments: a last segment of at most a header that does not open is an
        # interrupted segment roll (or an interrupted creation of the first segment).
        try:
            with SegmentFile(paths[-1]) as segment:
                wrong = _header_mismatches(segment.header, paths[-1], partition_id, cluster_key)
        except (OSError, CorruptDataError) as exc:
            wrong = [str(exc)]
        if wrong:
            message = f"incomplete new segment ({'; '.join(wrong)}); start-up removes it"
            out.append(Problem(Severity.WARNING, message, paths[-1], partition_id, 0))
            paths.pop()
    return paths


def _chain_problems(previous: SegmentReport | None, report: SegmentReport, pid: int) -> list[Problem]:
    """Check that ``report``'s segment starts where ``previous`` ends. The first segment may start
    anywhere: at the partition's local start (docs/design/archive.md, "Terms")."""
    if report.header is None or previous is None:
        return []
    first = report.first_transaction_id
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
    paths = _segment_paths(directory, partition_id, cluster_key, problems)
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
    retention = _retention(directory, partition_id, problems)
    return PartitionReport(partition_id, directory, tuple(segments), tuple(problems), retention)


def _retention(directory: Path, partition_id: int, out: list[Problem]) -> RetentionRecord | None:
    """Read the partition's retention file; a damaged one is a WARNING (the node takes -1)."""
    try:
        return read_retention_file(directory, partition_id)
    except (CorruptDataError, OSError) as exc:
        message = (
            f"{exc}; the node takes archived-through as -1 (retention deletes nothing) until the "
            "archiver sets it again"
        )
        out.append(Problem(Severity.WARNING, message, directory / RETENTION_FILE, partition_id))
        return None


# ---- storage directory ----


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
            directory is not a readable storage directory (see ``read_control_file``).
    """
    control = read_control_file(storage_dir)
    outside: list[Problem] = []
    if control.trailing_bytes:
        message = f"{control.trailing_bytes} unexpected bytes after the fence section"
        outside.append(
            Problem(Severity.WARNING, message, control.path, -1, control.size - control.trailing_bytes)
        )
    present = fmt.partition_directories(storage_dir)  # as StorageNode.start opens them
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
        own.extend(_held_below_local_low_water_mark(control.partitions[pid], report))
        reports.append(
            PartitionReport(pid, directory, report.segments, (*own, *report.problems), report.retention)
        )
    if partitions is None:
        for entry in control.partitions:
            if entry.partition_id not in present:
                outside.extend(_control_problems(control, entry))
    return StorageReport(storage_dir, control, tuple(reports), tuple(outside))
