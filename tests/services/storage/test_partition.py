"""A storage partition on disk: appends, reads, segment rolls, truncation, recovery, corruption."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from waltz.errors import (
    CorruptDataError,
    PartitionUnavailableError,
    ProtocolError,
    SessionFencedError,
)
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt
from waltz.services.storage.control_file import ControlFile
from waltz.services.storage.storage_partition import StoragePartition


def make_records(first: int, count: int, size: int = 100) -> list[Record]:
    return [
        Record.create(txn, ReqId(7, 1, 0, txn), txn % 5, bytes([txn % 251]) * (size + txn % 13))
        for txn in range(first, first + count)
    ]


class Store:
    """A storage directory with a control file, and partitions opened and reopened on it."""

    def __init__(self, root: Path, threshold: int = 1 << 30, checkpoint: int = 1000) -> None:
        self.root = root
        self.threshold = threshold
        self.checkpoint = checkpoint
        self.control = ControlFile.create(root, uuid.uuid4(), 2)
        self.partition = self._open()

    def _open(self) -> StoragePartition:
        return StoragePartition.create(
            self.root / "0",
            0,
            self.control,
            segment_size_threshold=self.threshold,
            checkpoint_interval=self.checkpoint,
        )

    def reopen(self) -> StoragePartition:
        self.partition.close()
        self.control.close()
        self.control = ControlFile.open(self.root)
        self.partition = self._open()
        return self.partition

    def segments(self) -> list[Path]:
        return sorted((self.root / "0").glob("*.seg"))

    def close(self) -> None:
        self.partition.close()
        self.control.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path, threshold=4096, checkpoint=10)
    yield s
    s.close()


def test_empty_partition(store: Store) -> None:
    assert store.partition.max_transaction_id == -1
    assert store.partition.read_records(0, 10) == []
    assert store.partition.read_record(0) is None
    assert [p.name for p in store.segments()] == ["0000000000000000000.seg"]


def test_append_read_round_trip_and_reopen(store: Store) -> None:
    records = make_records(0, 250)
    store.partition.append(records[:100])
    store.partition.append(records[100:])
    assert store.partition.max_transaction_id == 249
    assert store.partition.read_records(0, 1000) == records
    assert store.partition.read_records(100, 5) == records[100:105]
    assert store.partition.read_record(249) == records[249]
    assert store.partition.read_record(250) is None
    assert [h.transaction_id for h in store.partition.read_headers(10, 3)] == [10, 11, 12]
    partition = store.reopen()
    assert partition.max_transaction_id == 249
    assert partition.read_records(0, 1000) == records


def test_response_size_budget(store: Store) -> None:
    records = make_records(0, 50, size=1000)
    store.partition.append(records)
    got = store.partition.read_records(0, 50, max_bytes=5000)
    assert 1 <= len(got) < 50
    assert sum(len(r.data) + fmt.RECORD_FIXED_SIZE for r in got) <= 5000
    # One record is always returned, even when it is larger than the budget.
    assert store.partition.read_records(3, 50, max_bytes=10) == records[3:4]


def test_segments_roll_and_chain(small_store: Store) -> None:
    records = make_records(0, 200)
    for i in range(0, 200, 7):
        small_store.partition.append(records[i : i + 7])
    assert len(small_store.segments()) > 3
    firsts = [int(p.stem) for p in small_store.segments()]
    assert firsts[0] == 0 and firsts == sorted(firsts)
    partition = small_store.reopen()
    assert partition.read_records(0, 1000, max_bytes=1 << 30) == records
    assert partition.stats().segments == len(firsts)


def test_appends_must_follow_the_max_and_carry_valid_checksums(store: Store) -> None:
    store.partition.append(make_records(0, 3))
    with pytest.raises(ProtocolError, match="expected 3"):
        store.partition.append(make_records(4, 1))
    bad = make_records(3, 1)[0]
    bad = Record(bad.transaction_id, bad.req_id, bad.header, bad.data, bad.checksum ^ 1)
    with pytest.raises(ProtocolError, match="checksum"):
        store.partition.append([bad])
    assert store.partition.max_transaction_id == 2


def test_truncate_across_segments_survives_reopen(small_store: Store) -> None:
    records = make_records(0, 150)
    for i in range(0, 150, 10):
        small_store.partition.append(records[i : i + 10])
    segments_before = len(small_store.segments())
    small_store.partition.truncate(42)
    assert small_store.partition.max_transaction_id == 42
    assert len(small_store.segments()) < segments_before
    partition = small_store.reopen()
    assert partition.max_transaction_id == 42
    assert partition.read_records(0, 1000, max_bytes=1 << 30) == records[:43]
    partition.append(records[43:60])
    assert partition.read_records(40, 10) == records[40:50]
    partition.truncate(-1)
    assert partition.max_transaction_id == -1
    assert small_store.reopen().max_transaction_id == -1


def test_index_rebuilt_from_last_checkpoint(small_store: Store) -> None:
    small_store.threshold = 1 << 30
    partition = small_store.reopen()
    records = make_records(0, 37)
    partition.append(records)
    index = small_store.segments()[-1].with_suffix(".idx")
    partition.close()
    # Garbage after the last checkpoint (30 entries) and missing entries are both rebuilt.
    raw = bytearray(index.read_bytes())
    raw[fmt.HEADER_SIZE + 33 * 8 : fmt.HEADER_SIZE + 34 * 8] = b"\xff" * 8
    index.write_bytes(bytes(raw[: fmt.HEADER_SIZE + 35 * 8]))
    partition = small_store.reopen()
    assert partition.max_transaction_id == 36
    assert partition.read_records(0, 100) == records
    # A missing index file is rebuilt from scratch.
    partition.close()
    index.unlink()
    assert small_store.reopen().read_records(0, 100) == records


def test_torn_tail_is_cut_at_start_up(store: Store) -> None:
    records = make_records(0, 20)
    store.partition.append(records)
    segment = store.segments()[-1]
    good_size = segment.stat().st_size
    partial = fmt.encode_record(make_records(20, 1)[0])[:-7]
    with open(segment, "ab") as f:
        f.write(partial)
    partition = store.reopen()
    assert partition.max_transaction_id == 19
    assert segment.stat().st_size == good_size
    assert partition.read_records(0, 100) == records
    # The cut bytes are kept beside the segment, and never taken for a segment.
    [kept] = segment.parent.glob("*.tail-*")
    assert kept.name == f"{segment.name}.tail-{good_size}"
    assert kept.read_bytes() == partial
    partition = store.reopen()
    assert partition.max_transaction_id == 19
    partition.append(make_records(20, 1))
    assert partition.max_transaction_id == 20


def test_zeroed_tail_is_cut_at_start_up(store: Store) -> None:
    store.partition.append(make_records(0, 5))
    segment = store.segments()[-1]
    good_size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\0" * 300)
    assert store.reopen().max_transaction_id == 4
    assert segment.stat().st_size == good_size


def test_corruption_before_the_tail_is_reported_and_never_cut(store: Store) -> None:
    records = make_records(0, 20)
    store.partition.append(records)
    segment = store.segments()[-1]
    size = segment.stat().st_size
    offset_of_10 = fmt.HEADER_SIZE + sum(fmt.RECORD_FIXED_SIZE + len(r.data) for r in records[:10])
    raw = bytearray(segment.read_bytes())
    raw[offset_of_10 + fmt.RECORD_HEADER_SIZE + 5] ^= 0x01  # a byte of transaction 10's data
    segment.write_bytes(bytes(raw))
    partition = store.reopen()
    assert segment.stat().st_size == size  # nothing cut
    assert partition.corruption is not None
    assert partition.corruption.transaction_id == 10
    assert partition.corruption.offset == offset_of_10
    assert partition.max_transaction_id == 9
    assert partition.read_records(0, 10) == records[:10]
    with pytest.raises(CorruptDataError) as info:
        partition.read_records(10, 5)
    assert (info.value.partition_id, info.value.offset, info.value.transaction_id) == (0, offset_of_10, 10)
    with pytest.raises(CorruptDataError, match="truncate"):
        partition.append(make_records(10, 1))
    assert partition.append_rows(iter(())) == 0  # appending nothing is no error
    # Reopening again finds the same corruption: it is never cut away at start-up.
    partition = store.reopen()
    assert partition.corruption is not None and segment.stat().st_size == size
    # An explicit truncate (the recovery of a store session) removes it.
    partition.truncate(9)
    assert partition.corruption is None
    partition.append(records[10:])
    assert store.reopen().read_records(0, 100) == records


def test_flipped_byte_in_a_sealed_segment_is_reported_on_read(small_store: Store) -> None:
    records = make_records(0, 100)
    for i in range(0, 100, 10):
        small_store.partition.append(records[i : i + 10])
    first_segment = small_store.segments()[0]
    raw = bytearray(first_segment.read_bytes())
    target = fmt.HEADER_SIZE + fmt.RECORD_FIXED_SIZE + len(records[0].data)  # transaction 1
    raw[target + 40] ^= 0x80
    first_segment.write_bytes(bytes(raw))
    partition = small_store.reopen()
    assert first_segment.stat().st_size == len(raw)
    assert partition.read_records(0, 1) == records[:1]
    with pytest.raises(CorruptDataError) as info:
        partition.read_records(0, 10)
    assert info.value.transaction_id == 1
    assert info.value.offset == target
    assert info.value.partition_id == 0
    assert str(first_segment) in str(info.value)


def test_session_fencing_is_persisted(store: Store) -> None:
    partition = store.partition
    partition.check_session(5, opens=True)
    partition.check_session(5, opens=False)
    with pytest.raises(SessionFencedError) as info:
        partition.check_session(4, opens=True)
    assert info.value.current_session_id == 5
    partition = store.reopen()
    with pytest.raises(SessionFencedError):
        partition.check_session(4, opens=False)
    # The last session info is what the last low-water mark set, not the fence.
    assert partition.last_session_info().session_id == -1
    partition.append(make_records(0, 10))
    partition.set_low_water_mark(5, 20)
    assert partition.last_session_info() == fmt.PartitionInfo(5, 20, 9)
    assert store.reopen().last_session_info() == fmt.PartitionInfo(5, 20, 9)


def test_availability_toggles(store: Store) -> None:
    partition = store.partition
    partition.writable = False
    with pytest.raises(PartitionUnavailableError, match="not writable"):
        partition.append(make_records(0, 1))
    partition.writable = True
    partition.append(make_records(0, 1))
    partition.readable = False
    with pytest.raises(PartitionUnavailableError, match="not readable"):
        partition.read_records(0, 1)


DISK_FULL_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys, uuid
    from pathlib import Path
    from waltz.errors import DiskFullError
    from waltz.protocol.records import Record, ReqId
    from waltz.services.storage.control_file import ControlFile
    from waltz.services.storage.storage_partition import StoragePartition

    root = Path(sys.argv[1])
    control = ControlFile.create(root, uuid.uuid4(), 1)
    partition = StoragePartition.create(root / "0", 0, control)
    partition.append([Record.create(i, ReqId(1, 1, 0, i), 0, b"a" * 1000) for i in range(10)])
    size = (root / "0" / "0000000000000000000.seg").stat().st_size
    # Any file may grow to 5,000 bytes more than this segment: the next batch does not fit.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 5000, resource.RLIM_INFINITY))
    try:
        partition.append([Record.create(10 + i, ReqId(1, 1, 0, i), 0, b"b" * 1000) for i in range(10)])
    except DiskFullError as exc:
        print("DISK FULL:", exc)
    assert partition.max_transaction_id == 9, partition.max_transaction_id
    assert (root / "0" / "0000000000000000000.seg").stat().st_size == size
    partition.append([Record.create(10, ReqId(1, 1, 0, 0), 0, b"c" * 100)])
    assert partition.max_transaction_id == 10
    print("OK")
    """
)


def test_disk_full_fails_the_append_and_leaves_the_log_unchanged(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "DISK FULL: partition 0: no space left to append 10 records" in result.stdout
    assert "the log is unchanged" in result.stdout
    assert result.stdout.strip().endswith("OK")
    partition_control = ControlFile.open(tmp_path)
    partition = StoragePartition.create(tmp_path / "0", 0, partition_control)
    try:
        assert partition.max_transaction_id == 10
        assert partition.read_record(10) is not None
    finally:
        partition.close()
        partition_control.close()


def test_damaged_length_field_is_corruption_not_a_torn_tail(store: Store) -> None:
    records = make_records(0, 25)
    store.partition.append(records)
    segment = store.segments()[-1]
    size = segment.stat().st_size
    offset_of_21 = fmt.HEADER_SIZE + sum(fmt.RECORD_FIXED_SIZE + len(r.data) for r in records[:21])
    raw = bytearray(segment.read_bytes())
    raw[offset_of_21 + 29] ^= 0x10  # the data length field: the record now claims to end past the file
    segment.write_bytes(bytes(raw))
    partition = store.reopen()
    assert segment.stat().st_size == size, "records after the damaged one were cut"
    assert partition.corruption is not None and partition.corruption.transaction_id == 21
    assert partition.read_records(0, 100) == records[:21]


def test_garbage_index_entry_at_a_checkpoint_falls_back_and_is_rebuilt(small_store: Store) -> None:
    small_store.threshold = 1 << 30
    partition = small_store.reopen()
    records = make_records(0, 25)
    partition.append(records)
    index = small_store.segments()[-1].with_suffix(".idx")
    partition.close()
    raw = bytearray(index.read_bytes())
    raw[fmt.HEADER_SIZE + 19 * 8 : fmt.HEADER_SIZE + 20 * 8] = (-5).to_bytes(8, "big", signed=True)
    index.write_bytes(bytes(raw))
    partition = small_store.reopen()
    assert partition.read_records(0, 100) == records


def test_orphan_index_does_not_block_a_new_segment(tmp_path: Path) -> None:
    from waltz.services.storage.segment import Segment

    key = uuid.uuid4()
    orphan = tmp_path / fmt.segment_file_name(100, fmt.INDEX_SUFFIX)
    orphan.write_bytes(b"left over by a crash between deleting the index and the data")
    segment = Segment.create(tmp_path, 0, key, 100, 1000)
    try:
        assert segment.count == 0
        assert orphan.read_bytes()[: fmt.HEADER_SIZE] == segment.header.encode()
    finally:
        segment.close()


@pytest.mark.security
def test_a_read_decodes_no_more_index_entries_than_its_answer_can_hold(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request for 2^31 - 1 records costs what its byte budget can carry, not a walk of the index."""
    from waltz.services.storage.segment import Segment
    from waltz.services.storage.service import MAX_RECORDS_PER_READ, _positive

    store.partition.append(make_records(0, 300, size=10))
    decoded: list[int] = []
    real = Segment._index_entries

    def counting(self: Segment, index: int, count: int, **kwargs: Any) -> list[int]:
        decoded.append(count)
        return real(self, index, count, **kwargs)

    monkeypatch.setattr(Segment, "_index_entries", counting)
    got = store.partition.read_records(0, 2**31 - 1, max_bytes=400)
    assert 1 <= len(got) <= 400 // fmt.RECORD_FIXED_SIZE
    assert max(decoded) <= 400 // fmt.RECORD_FIXED_SIZE + 1 + 1  # the entries, and one end offset
    assert store.partition.read_records(0, 2**31 - 1) == make_records(0, 300, size=10)  # all fit
    assert _positive(2**31 - 1) == MAX_RECORDS_PER_READ and _positive(5) == 5


def test_a_failed_roll_after_a_durable_append_is_not_reported_as_a_failed_append(
    small_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up just as a segment is full: the records are written and flushed, so the
    append succeeds; the roll is tried again by the next append, which fails honestly (nothing
    appended) while the disk stays full and goes on once there is room."""
    from waltz.errors import DiskFullError
    from waltz.services.storage.segment import Segment

    real_create = Segment.create
    full = {"on": True}

    def create(*args: Any, **kwargs: Any) -> Segment:
        if full["on"]:
            raise DiskFullError("partition 0: no space to create segment (simulated)")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(Segment, "create", create)
    records = make_records(0, 60, size=100)  # past the 4,096-byte threshold
    small_store.partition.append(records)  # no error: the records are durable
    assert small_store.partition.max_transaction_id == 59
    assert len(small_store.segments()) == 1
    with pytest.raises(DiskFullError):
        small_store.partition.append(make_records(60, 1))
    assert small_store.partition.max_transaction_id == 59  # that append changed nothing
    full["on"] = False
    small_store.partition.append(make_records(60, 1))  # rolls first, then appends
    assert small_store.partition.max_transaction_id == 60
    assert len(small_store.segments()) == 2
    partition = small_store.reopen()
    assert partition.read_records(0, 100) == [*records, *make_records(60, 1)]


@pytest.mark.parametrize("length", [0, 10, fmt.HEADER_SIZE - 1])
def test_a_first_segment_cut_short_while_being_created_is_made_again(tmp_path: Path, length: int) -> None:
    """A crash while the partition's first segment was being created leaves a file shorter than
    its header: it holds no record, so start-up replaces it instead of refusing the partition."""
    control = ControlFile.create(tmp_path, uuid.uuid4(), 1)
    directory = tmp_path / "0"
    directory.mkdir()
    name = fmt.segment_file_name(0, fmt.SEGMENT_SUFFIX)
    (directory / name).write_bytes(b"\x00" * length)
    try:
        partition = StoragePartition.create(directory, 0, control)
        assert partition.max_transaction_id == -1
        partition.append(make_records(0, 3))
        assert partition.read_records(0, 10) == make_records(0, 3)
        partition.close()
    finally:
        control.close()


def test_a_damaged_length_before_unindexed_records_is_corruption_not_a_torn_tail(store: Store) -> None:
    """A length field damaged so that its record seems to run past the end of the file looks like a
    torn tail; but the records after it are valid (their index entries are not flushed yet: the
    index checkpoints every 1,000), so nothing is cut and the damage is reported."""
    records = make_records(0, 100)
    store.partition.append(records)
    segment = store.segments()[-1]
    size = segment.stat().st_size
    offset_of_50 = fmt.HEADER_SIZE + sum(fmt.RECORD_FIXED_SIZE + len(r.data) for r in records[:50])
    raw = bytearray(segment.read_bytes())
    length_at = offset_of_50 + fmt.RECORD_HEADER_SIZE - 8  # the data length, before the data CRC
    raw[length_at : length_at + 4] = (size * 2).to_bytes(4, "big")  # past the end, yet possible
    segment.write_bytes(bytes(raw))
    partition = store.reopen()
    assert segment.stat().st_size == size  # the 50 acknowledged records after it are still there
    assert partition.corruption is not None and partition.corruption.transaction_id == 50
    assert not list(segment.parent.glob("*.tail-*"))
    partition.truncate(49)  # what a store session's recovery does; it then copies them back
    partition.append(records[50:])
    assert store.reopen().read_records(0, 200) == records


QUARANTINE_FULL_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys, uuid
    from pathlib import Path
    from waltz.protocol.records import Record, ReqId
    from waltz.services.storage import format as fmt
    from waltz.services.storage.control_file import ControlFile
    from waltz.services.storage.storage_partition import StoragePartition

    root = Path(sys.argv[1])
    control = ControlFile.create(root, uuid.uuid4(), 1)
    partition = StoragePartition.create(root / "0", 0, control)
    partition.append([Record.create(i, ReqId(1, 1, 0, i), 0, b"a" * 20) for i in range(5)])
    partition.close()
    segment = root / "0" / "0000000000000000000.seg"
    good = segment.stat().st_size
    torn = fmt.encode_record(Record.create(5, ReqId(1, 1, 0, 5), 0, b"b" * 3000))[:2000]
    with open(segment, "ab") as f:
        f.write(torn)
    # No file may grow past the records kept: the tail's copy cannot be written.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (good + 100, resource.RLIM_INFINITY))
    partition = StoragePartition.create(root / "0", 0, control)
    assert partition.max_transaction_id == 4, partition.max_transaction_id
    assert segment.stat().st_size == good
    assert not list(segment.parent.glob("*.tail-*")), list(segment.parent.glob("*.tail-*"))
    print("OK")
    """
)


def test_a_torn_tail_is_cut_even_when_its_copy_cannot_be_written(tmp_path: Path) -> None:
    """A full disk (often why the node stopped) does not keep the partition from opening: the
    copy of the cut bytes is dropped, with an error in the log."""
    result = subprocess.run(
        [sys.executable, "-c", QUARANTINE_FULL_SCRIPT, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("OK")
    assert "could not keep the 2000 bytes of the torn tail" in result.stderr
