"""A partition's records ``first..last`` as an operator dumps them: from the segments of a storage
directory, and from the archive below its local start.

Source: docs/design/archive.md "Reads below the local start" (``waltz disk``);
docs/format.md "Transaction record (40 bytes + data)". The records on disk are scanned segment
after segment (both CRCs checked, IDs consecutive); the range below the partition's local start
(the segments retention deleted) is read from the archive's chunks with every check of a chunk
read. Only reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from waltz.archive.chunks import chunk_path, read_chunk
from waltz.archive.layout import ARCHIVE_MANIFEST, ArchiveFiles
from waltz.archive.manifests import read_archive_manifest, read_partition_manifest
from waltz.archive.reader import chunks_of
from waltz.errors import WaltzError
from waltz.protocol.records import Record
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import (
    RecordScan,
    SegmentFile,
    StopKind,
    classify_stop,
    find_record_offset,
)

__all__ = [
    "DumpRangeError",
    "DumpedRecord",
    "PartitionRange",
    "dump_records",
    "partition_range",
    "segment_paths",
]


class DumpRangeError(WaltzError):
    """The range asked for is not where the dump may read it (below the local start without an
    archive, past what the files hold, or behind a corrupt record)."""


@dataclass(frozen=True, slots=True)
class DumpedRecord:
    """One record of a dump and where it was read.

    Attributes:
        record: the record (its data checked against its checksum).
        source: the segment file, or the archive's chunk file (its location and path).
        archived: True when it was read from the archive.
    """

    record: Record
    source: str
    archived: bool


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What a partition's files hold.

    Attributes:
        local_start: the first transaction of its first segment (None: no storage directory, or
            no segment).
        last_on_disk: the last transaction of its segments as their names and the last one's scan
            say (-1: none); with ``corruption``, the last one before the corrupt record.
        archive_start: the first archived transaction (None: no archive, or nothing archived).
        archived_through: the last archived transaction (-1: none).
        corruption: None when the scan of the last segment holding records ended at the end of
            the file or at a torn tail (which start-up cuts); else where it stopped, as start-up
            classifies it (:func:`~waltz.services.storage.inspect.reader.classify_stop`): "a
            corrupt record at offset O of FILE where transaction T was due (why)". The records
            on disk end there for a reader (docs/design/storage.md "Start-up checks and torn
            tails"); ``waltz disk verify`` says what lies after it.
        corrupt_transaction_id: the transaction due at the corrupt record (None without one).
    """

    local_start: int | None
    last_on_disk: int
    archive_start: int | None
    archived_through: int
    corruption: str | None = None
    corrupt_transaction_id: int | None = None


def segment_paths(storage_dir: Path | str, partition_id: int) -> list[Path]:
    """A partition's segment files in a storage directory, in transaction order (each is named
    after its first transaction ID: docs/design/storage.md "Files on disk"); [] when it has none."""
    return sorted((Path(storage_dir) / str(partition_id)).glob("*" + fmt.SEGMENT_SUFFIX))


def partition_range(
    storage_dir: Path | None, partition_id: int, archive: ArchiveFiles | None
) -> PartitionRange:
    """Where a partition's records are: its segments' range and the archive's.

    The last segment that holds a record is scanned; when the scan stops at a corrupt record (not
    a torn tail), the range says so (:attr:`PartitionRange.corruption`).

    Raises:
        OSError: a segment file cannot be read.
        CorruptDataError: a segment header is unusable.
        ArchiveFormError, ArchiveCheckError: the partition's manifest is not one this code reads.
        DumpRangeError: ``archive`` holds no archive (no ``archive.json``), or not the partition.
    """
    local_start: int | None = None
    last = -1
    corruption: str | None = None
    corrupt_id: int | None = None
    if storage_dir is not None:
        paths = segment_paths(storage_dir, partition_id)
        if paths:
            with SegmentFile(paths[0]) as first_segment:
                local_start = first_segment.header.first_transaction_id
            for path in reversed(paths):
                with SegmentFile(path) as segment:
                    scan = segment.scan()
                    ids = [s.record.transaction_id for s in scan]
                    last = ids[-1] if ids else segment.header.first_transaction_id - 1
                    corruption = _corruption(segment, scan, last + 1)
                    if ids or corruption is not None:
                        corrupt_id = None if corruption is None else last + 1
                        break
    start, through = None, -1
    if archive is not None:
        _require_archive(archive, partition_id)
        manifest = read_partition_manifest(archive, partition_id)
        start, through = manifest.start, manifest.archived_through
    return PartitionRange(local_start, last, start, through, corruption, corrupt_id)


def _corruption(segment: SegmentFile, scan: RecordScan, due: int) -> str | None:
    """Where a finished ``scan`` of ``segment`` stopped at a corrupt record, in words; None when it
    ended at the end of the file or at a torn tail (``due``: the transaction expected there)."""
    if scan.stop is None:  # pragma: no cover - a finished scan always says why it stopped
        return None
    stop = classify_stop(segment, scan.stop, due)
    if stop.kind is not StopKind.CORRUPT:
        return None
    return (
        f"a corrupt record at offset {stop.offset} of {segment.path} where transaction {due} was due "
        f"({stop.reason})"
    )


def _require_archive(archive: ArchiveFiles, partition_id: int) -> None:
    """An archive is at the location, and it has the partition (docs/design/archive.md, "The
    archive's layout and forms": ``archive.json`` names the partition count); a mistyped location
    would otherwise read as an archive that holds nothing."""
    top = read_archive_manifest(archive)
    if top is None:
        raise DumpRangeError(
            f"{archive.location} holds no archive (no {archive.name(ARCHIVE_MANIFEST)}): check the location "
            "given with --archive"
        )
    if not 0 <= partition_id < top.num_partitions:
        raise DumpRangeError(
            f"partition {partition_id}: the archive at {archive.location} has partitions "
            f"0..{top.num_partitions - 1}"
        )


def dump_records(
    storage_dir: Path | None,
    partition_id: int,
    first: int,
    last: int,
    archive: ArchiveFiles | None = None,
) -> Iterator[DumpedRecord]:
    """Yield the records ``first..last`` of a partition in order: from the archive below the
    storage directory's local start (or everywhere, without a storage directory), then from its
    segments.

    Args:
        storage_dir: the storage directory (holding ``waltz-storage.ctl``), or None: the archive only.
        partition_id: the partition.
        first: the first transaction ID.
        last: the last transaction ID (inclusive); the segments' records may end before it.
        archive: the archive's files, or None.

    Raises:
        DumpRangeError: a part of the range is below the local start and no archive is given,
            or the segments hold no record where one is due (a gap, or a corrupt record as
            start-up classifies it, named with its file, offset and due transaction:
            docs/design/storage.md "Start-up checks and torn tails"). The records before it have
            been yielded.
        ArchiveCheckError: the archive does not hold the range below the local start, or a chunk
            fails a check (the message names the file and its range).
        OSError: a file cannot be read.
    """
    if last < first:
        return
    paths = [] if storage_dir is None else segment_paths(storage_dir, partition_id)
    local_start = None
    if paths:
        with SegmentFile(paths[0]) as head:
            local_start = head.header.first_transaction_id
    below = last if local_start is None else min(last, local_start - 1)
    next_id = first
    if first <= below:
        if archive is None:
            where = "it has no segment" if local_start is None else f"its local start is {local_start}"
            raise DumpRangeError(
                f"partition {partition_id}: transactions {first}..{below} are not in "
                f"{storage_dir or 'the storage directory'} ({where}; retention deleted what the archive "
                "holds): give the archive with --archive URL"
            )
        manifest = read_partition_manifest(archive, partition_id)
        for entry in chunks_of(archive, manifest, first, below):
            name = archive.name(chunk_path(partition_id, entry.file))
            for record in read_chunk(archive, partition_id, entry):
                if first <= record.transaction_id <= below:
                    yield DumpedRecord(record, name, True)
        next_id = below + 1
    if next_id > last or storage_dir is None:
        return
    yield from _segment_records(paths, partition_id, next_id, last)


def _segment_records(paths: list[Path], partition_id: int, first: int, last: int) -> Iterator[DumpedRecord]:
    """The records ``first..last`` of ``paths``; they may end before ``last`` (at the end of the
    last segment, or at a torn tail start-up cuts), never at a corrupt record or a gap."""
    firsts = [int(p.stem) for p in paths]
    start_index = max((i for i, f in enumerate(firsts) if f <= first), default=0)
    next_id = first
    for path in paths[start_index:]:
        with SegmentFile(path) as segment:
            if segment.header.first_transaction_id > next_id:
                raise DumpRangeError(
                    f"partition {partition_id}: transaction {next_id} is in no segment ({path} starts at "
                    f"{segment.header.first_transaction_id}); run waltz disk verify"
                )
            scan = segment.scan(find_record_offset(segment, next_id))
            for scanned in scan:
                record = scanned.record
                if record.transaction_id < next_id:
                    continue
                if record.transaction_id != next_id:
                    raise DumpRangeError(
                        f"partition {partition_id}: {path} holds transaction {record.transaction_id} where "
                        f"{next_id} was due; run waltz disk verify"
                    )
                yield DumpedRecord(record, str(path), False)
                next_id += 1
                if next_id > last:
                    return
            corruption = _corruption(segment, scan, next_id)
            if corruption is not None:
                raise DumpRangeError(
                    f"partition {partition_id}: {corruption}: it and the records after it cannot be "
                    f"listed; run waltz disk verify-segment {path}"
                )
