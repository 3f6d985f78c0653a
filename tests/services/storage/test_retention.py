"""A partition's local start, reads below it, reset start, archived-through and retention, on disk.

Design: docs/design/archive.md, "Terms", "Retention on the storage nodes", "Reads below the local
start". Real partitions in a real storage directory (control file, segments, index files).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.errors import CorruptDataError, PartitionUnavailableError, ProtocolError, RecordsArchivedError
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile
from waltz.services.storage.retention import (
    RetentionPolicy,
    RetentionSettings,
    SegmentSpan,
    segments_to_delete,
)
from waltz.services.storage.retention_file import RETENTION_FILE, read_retention_file
from waltz.services.storage.storage_partition import StoragePartition

#: Segments of about six 100-byte records each.
THRESHOLD = 700
ARCHIVED = RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds=0)


def records(first: int, count: int) -> list[Record]:
    return [
        Record.create(t, ReqId(3, 1, 0, t), t % 7, bytes([t % 251]) * 100)
        for t in range(first, first + count)
    ]


class Disk:
    """A storage directory whose partition 0 is opened, and reopened as a restarted node does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.control = ControlFile.create(root, uuid.uuid4(), 1)
        self.partition: StoragePartition | None = None

    @property
    def directory(self) -> Path:
        return self.root / "0"

    def open(self, first_transaction_id: int = 0) -> StoragePartition:
        self.partition = StoragePartition.create(
            self.directory,
            0,
            self.control,
            segment_size_threshold=THRESHOLD,
            checkpoint_interval=4,
            first_transaction_id=first_transaction_id,
        )
        return self.partition

    def reopen(self) -> StoragePartition:
        assert self.partition is not None
        self.partition.close()
        self.control.close()
        self.control = ControlFile.open(self.root)
        return self.open()

    def files(self) -> list[str]:
        return sorted(p.name for p in self.directory.iterdir())

    def close(self) -> None:
        if self.partition is not None:
            self.partition.close()
        self.control.close()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path)
    yield d
    d.close()


def filled(disk: Disk, count: int = 60) -> StoragePartition:
    """Partition 0 holding transactions 0..count-1 in segments of six records (the last one open)."""
    partition = disk.open()
    for first in range(0, count, 3):
        partition.append(records(first, 3))
    return partition


def test_a_partition_created_to_start_at_a_transaction(disk: Disk) -> None:
    partition = disk.open(first_transaction_id=1000)
    assert (partition.local_start, partition.max_transaction_id) == (1000, 999)
    assert disk.files() == [
        fmt.segment_file_name(1000, fmt.INDEX_SUFFIX),
        fmt.segment_file_name(1000, ".seg"),
    ]
    with pytest.raises(ProtocolError):
        partition.append(records(0, 1))  # appends continue the log: 1000 next
    partition = disk.reopen()  # empty, and still starting at 1000
    assert (partition.local_start, partition.max_transaction_id) == (1000, 999)
    partition.append(records(1000, 3))
    assert partition.read_records(1000, 10) == records(1000, 3)
    assert partition.read_records(1003, 10) == []
    partition = disk.reopen()
    assert (partition.local_start, partition.max_transaction_id) == (1000, 1002)
    with pytest.raises(ValueError, match="at least 0"):
        StoragePartition(disk.directory, 0, disk.control, first_transaction_id=-1)


def test_reads_below_the_local_start_name_it(disk: Disk) -> None:
    partition = disk.open(first_transaction_id=50)
    partition.append(records(50, 5))
    for read in (
        lambda: partition.read_records(49, 10),
        lambda: partition.read_record(0),
        lambda: partition.read_headers(10, 10),
    ):
        with pytest.raises(RecordsArchivedError) as info:
            read()
        assert info.value.local_start == 50 and info.value.code == "RECORDS_ARCHIVED"
        assert "below the local start 50" in str(info.value)
    assert partition.read_records(-1, 10) == []  # not a transaction ID: nothing, as before
    assert [r.transaction_id for r in partition.read_records(50, 10)] == list(range(50, 55))


def test_a_truncation_below_the_local_start_is_refused(disk: Disk) -> None:
    partition = disk.open(first_transaction_id=50)
    partition.append(records(50, 20))
    with pytest.raises(ProtocolError, match="gap"):
        partition.truncate(48)
    assert partition.max_transaction_id == 69
    partition.truncate(49)  # every record goes; the log still starts at 50
    assert (partition.local_start, partition.max_transaction_id) == (50, 49)
    partition = disk.reopen()
    assert (partition.local_start, partition.max_transaction_id) == (50, 49)


def test_a_replica_that_holds_no_record_starts_its_log_anywhere_above_its_max(disk: Disk) -> None:
    """A new replica of a split's child (whose log starts after its parent's barrier) or of a
    restored partition erases nothing by a reset start: the archive need not hold what it skips
    (docs/design/archive.md, "Reads below the local start")."""
    partition = disk.open()
    assert (partition.local_start, partition.max_transaction_id) == (0, -1)
    partition.reset_start(46)
    assert (partition.local_start, partition.max_transaction_id) == (46, 45)
    partition.reset_start(60)  # still empty: again
    assert (partition.local_start, partition.max_transaction_id) == (60, 59)
    partition.append(records(60, 3))
    with pytest.raises(ProtocolError, match="knows the archive holds the partition through -1 only"):
        partition.reset_start(100)  # now it would erase 60..62
    assert (partition.local_start, partition.max_transaction_id) == (60, 62)


def test_reset_start_discards_the_log_and_starts_it_after_the_gap(disk: Disk) -> None:
    partition = filled(disk, 40)
    assert len(partition.segment_spans()) > 3
    for refused in (40, 39, 0):  # not above max + 1: the replica can copy from there
        with pytest.raises(ProtocolError, match="above the max transaction ID"):
            partition.reset_start(refused)
    # The transactions below the new start must be in the archive, as the archiver told the node.
    before = (partition.local_start, partition.max_transaction_id)
    with pytest.raises(ProtocolError, match="knows the archive holds the partition through -1 only"):
        partition.reset_start(100)
    partition.set_archived_through(98, archive="file:///a", operator="archiver")
    with pytest.raises(ProtocolError, match="through 98 only"):
        partition.reset_start(100)
    assert (partition.local_start, partition.max_transaction_id) == before  # nothing changed
    partition.set_archived_through(99, archive="file:///a", operator="archiver")
    partition.writable = False
    with pytest.raises(PartitionUnavailableError):
        partition.reset_start(100)
    partition.writable = True
    partition.reset_start(100)
    assert (partition.local_start, partition.max_transaction_id) == (100, 99)
    assert disk.files() == [
        fmt.segment_file_name(100, ".idx"),
        fmt.segment_file_name(100, ".seg"),
        RETENTION_FILE,  # what the archiver told the node stays
    ]
    with pytest.raises(RecordsArchivedError, match="local start 100"):
        partition.read_records(39, 1)
    partition.append(records(100, 10))
    partition = disk.reopen()
    assert (partition.local_start, partition.max_transaction_id) == (100, 109)
    assert partition.read_records(100, 20) == records(100, 10)


def test_set_archived_through_is_kept_in_the_retention_file(disk: Disk) -> None:
    partition = disk.open()
    assert partition.archived_through == -1 and not (disk.directory / RETENTION_FILE).exists()
    assert partition.set_archived_through(41, archive="s3://bucket/a", operator="archiver@host") == -1
    document = json.loads((disk.directory / RETENTION_FILE).read_text())
    assert document["form"] == 1 and document["kind"] == "waltz-storage-retention"
    assert (document["partition_id"], document["archived_through"]) == (0, 41)
    assert (document["archive"], document["operator"]) == ("s3://bucket/a", "archiver@host")
    assert document["updated_at"].endswith("Z")
    assert partition.set_archived_through(7) == 41  # lower is taken too
    with pytest.raises(ProtocolError, match="at least -1"):
        partition.set_archived_through(-2)
    assert disk.reopen().archived_through == 7
    assert not (disk.directory / (RETENTION_FILE + ".tmp")).exists()


def test_retention_deletes_archived_sealed_segments_oldest_first(disk: Disk) -> None:
    partition = filled(disk, 60)
    spans = partition.segment_spans()
    assert len(spans) >= 8 and spans[-1].sealed_at is None
    # The policy "never" deletes nothing, whatever is archived.
    partition.set_archived_through(59)
    assert partition.apply_retention(RetentionSettings(keep_seconds=0), 1e12) == []
    # Archived through the middle of the fourth segment: the first three go, index before data.
    partition.set_archived_through(spans[3].first_transaction_id + 1)
    deleted = partition.apply_retention(ARCHIVED, spans[-2].sealed_at or 0)
    assert [d.first_transaction_id for d in deleted] == [s.first_transaction_id for s in spans[:3]]
    assert [d.size for d in deleted] == [s.size for s in spans[:3]]
    assert partition.local_start == spans[3].first_transaction_id
    assert fmt.segment_file_name(0, ".seg") not in disk.files()
    assert fmt.segment_file_name(0, ".idx") not in disk.files()
    with pytest.raises(RecordsArchivedError):
        partition.read_records(spans[3].first_transaction_id - 1, 1)
    assert (
        partition.read_records(spans[3].first_transaction_id, 1)[0].transaction_id
        == spans[3].first_transaction_id
    )
    # Everything archived: every segment but the last goes, never the last.
    partition.set_archived_through(59)
    partition.apply_retention(ARCHIVED, 1e12)
    assert len(partition.segment_spans()) == 1
    assert partition.local_start == spans[-1].first_transaction_id
    partition = disk.reopen()  # a restart keeps the local start
    assert partition.local_start == spans[-1].first_transaction_id and partition.max_transaction_id == 59
    assert partition.read_records(partition.local_start, 100) == records(
        partition.local_start, 60 - partition.local_start
    )


def test_each_keep_setting_holds_segments_back(disk: Disk) -> None:
    partition = filled(disk, 60)
    partition.set_archived_through(59)
    spans = partition.segment_spans()
    sealed = [s.sealed_at for s in spans[:-1]]
    assert all(t is not None for t in sealed)
    first_sealed = sealed[0] or 0.0
    # keepSeconds: a segment sealed less than keepSeconds ago stays (and so do all newer ones).
    hour = RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds=3600)
    assert partition.apply_retention(hour, first_sealed + 3599) == []
    assert [d.first_transaction_id for d in partition.apply_retention(hour, first_sealed + 3600)][:1] == [0]
    # keepSegments: at least that many newer segments remain after a deleted one.
    count = len(partition.segment_spans())
    three = RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds=0, keep_segments=3)
    partition.apply_retention(three, 1e12)
    assert len(partition.segment_spans()) == min(count, 3)
    # keepBytes: at least that many bytes of newer segments remain after a deleted one.
    spans = partition.segment_spans()
    newest_two = spans[-1].size + spans[-2].size
    two = RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds=0, keep_bytes=newest_two)
    assert [d.first_transaction_id for d in partition.apply_retention(two, 1e12)] == [
        spans[0].first_transaction_id
    ]
    assert len(partition.segment_spans()) == 2
    one_more = RetentionSettings(
        RetentionPolicy.ARCHIVED, keep_seconds=0, keep_bytes=newest_two - spans[-2].size + 1
    )
    assert partition.apply_retention(one_more, 1e12) == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"form": 2, "kind": "waltz-storage-retention", "partition_id": 0, "archived_through": 59}',
        b'{"form": 1, "kind": "waltz-storage-retention", "partition_id": 1, "archived_through": 59}',
        b'{"form": 1, "kind": "waltz-storage-retention", "partition_id": 0, "archived_through": "59"}',
        b'{"form": 1, "kind": "something else", "partition_id": 0, "archived_through": 59}',
        b"\xff\xfe",
        b"[" * 60_000,  # within the size limit; nested deeper than the JSON decoder recurses
        b'{"form": 1, "kind": "waltz-storage-retention", "partition_id": 0, "archived_through": '
        + b"9" * 5_000
        + b"}",  # longer than Python's limit on an integer's digits
    ],
    ids=[
        "not-json",
        "newer-form",
        "other-partition",
        "text-value",
        "other-kind",
        "not-utf8",
        "too-deep",
        "too-long",
    ],
)
def test_a_damaged_retention_file_deletes_nothing(
    disk: Disk, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    partition = filled(disk, 60)
    partition.set_archived_through(59)
    (disk.directory / RETENTION_FILE).write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="waltz.services.storage.retention_file"):
        partition = disk.reopen()
    assert partition.archived_through == -1
    assert any(
        "retention file is damaged" in r.message and r.levelno == logging.ERROR for r in caplog.records
    )
    before = disk.files()
    assert partition.apply_retention(ARCHIVED, 1e12) == []
    assert disk.files() == before  # the damaged file is kept for the operator, too
    with pytest.raises(CorruptDataError, match="damaged"):
        read_retention_file(disk.directory, 0)


def span(first: int, last: int, size: int, sealed: float | None) -> SegmentSpan:
    return SegmentSpan(first, last, size, sealed)


def test_segments_to_delete_needs_every_transaction_archived() -> None:
    spans = [span(0, 9, 100, 10.0), span(10, 19, 100, 20.0), span(20, 29, 100, None)]
    assert segments_to_delete(spans, 8, ARCHIVED, 100.0) == 0
    assert segments_to_delete(spans, 9, ARCHIVED, 100.0) == 1
    assert segments_to_delete(spans, 29, ARCHIVED, 100.0) == 2  # never the last
    assert segments_to_delete(spans, 29, RetentionSettings(keep_seconds=0), 100.0) == 0  # never
    assert segments_to_delete([], 29, ARCHIVED, 100.0) == 0


def test_retention_settings_refuse_bad_values() -> None:
    for bad in ({"keep_seconds": -1.0}, {"keep_segments": -1}, {"keep_bytes": -1}, {"check_interval": 0.0}):
        with pytest.raises(ValueError):
            RetentionSettings(**bad)


SPANS = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1000), st.floats(0, 1000)), max_size=8)


@given(
    SPANS,
    st.integers(-1, 400),
    st.floats(0, 100),
    st.integers(0, 5),
    st.integers(0, 3000),
    st.floats(0, 2000),
)
def test_segments_to_delete_is_the_longest_prefix_that_may_go(
    shape: list[tuple[int, int, float]],
    archived_through: int,
    keep_seconds: float,
    keep_segments: int,
    keep_bytes: int,
    now: float,
) -> None:
    """Oldest first: exactly the segments before the first one that must stay, never the last."""
    spans: list[SegmentSpan] = []
    first = 0
    sealed = 0.0
    for count, size, later in shape:
        sealed += later
        spans.append(span(first, first + count - 1, size, sealed))
        first += count
    if spans:
        spans[-1] = span(spans[-1].first_transaction_id, spans[-1].max_transaction_id, spans[-1].size, None)
    settings = RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds, keep_segments, keep_bytes)
    count = segments_to_delete(spans, archived_through, settings, now)

    def may_go(i: int) -> bool:
        s = spans[i]
        newer = spans[i + 1 :]
        return (
            s.sealed_at is not None
            and s.max_transaction_id <= archived_through
            and now - s.sealed_at >= keep_seconds
            and len(newer) >= keep_segments
            and sum(n.size for n in newer) >= keep_bytes
        )

    assert 0 <= count <= max(0, len(spans) - 1)
    assert all(may_go(i) for i in range(count))
    if count < len(spans) - 1:
        assert not may_go(count)
