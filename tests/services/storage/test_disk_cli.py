"""``waltz disk``: dumps, verification and statistics on real storage directories.

Each test builds a storage directory with the real ``ControlFile`` and ``StoragePartition``, then
damages bytes at known offsets and checks what ``waltz disk`` reports (docs/format.md;
docs/design/storage.md "Files on disk").
"""

from __future__ import annotations

import json
import logging
import os
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from waltz.cli.main import app
from waltz.errors import CorruptDataError
from waltz.protocol.cluster_key import cluster_key_fingerprint
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt
from waltz.services.storage import inspect
from waltz.services.storage.control_file import ControlFile
from waltz.services.storage.retention import RetentionPolicy, RetentionSettings
from waltz.services.storage.storage_partition import StoragePartition

CLUSTER_KEY = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")
DATA_SIZE = 100
RECORD_SIZE = fmt.RECORD_FIXED_SIZE + DATA_SIZE  # 140
#: With a 1,000-byte threshold a segment is sealed after 7 records (128 + 7 * 140 >= 1000).
THRESHOLD = 1000
RECORDS = 25  # partition 0: segments 0-6, 7-13, 14-20 (sealed) and 21-24 (last)
SMALL_RECORDS = 3  # partition 2: one segment of 3 records of 10 bytes
#: A byte of a record's data length field (record offset 28, docs/format.md): flipping it with
#: 0x5A makes a 100-byte record claim 5,898,340 bytes, more than any test file holds.
LENGTH_BYTE = 29
ONE_SEGMENT_RECORDS = 10  # the one_segment storage: partition 0 holds one segment of 10 records


def record(transaction_id: int, size: int = DATA_SIZE) -> Record:
    """The record written for ``transaction_id``: recognisable data of ``size`` bytes."""
    data = bytes([transaction_id % 256]) * size
    return Record.create(transaction_id, ReqId(1, 2, 0, transaction_id), transaction_id, data)


def offset_of(position: int) -> int:
    """The byte offset of the ``position``-th record of a partition 0 segment."""
    return fmt.HEADER_SIZE + position * RECORD_SIZE


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A storage directory of 3 partitions: 0 (4 segments), 2 (1 segment); 1 is not assigned."""
    directory = tmp_path / "storage"
    directory.mkdir()
    with ControlFile.create(directory, CLUSTER_KEY, 3) as control:
        partition = StoragePartition.create(directory / "0", 0, control, segment_size_threshold=THRESHOLD)
        try:
            for transaction_id in range(RECORDS):
                partition.append([record(transaction_id)])  # one batch each: exact segment rolls
            partition.set_low_water_mark(3, 20)
        finally:
            partition.close()
        small = StoragePartition.create(directory / "2", 2, control, segment_size_threshold=THRESHOLD)
        try:
            small.append([record(i, 10) for i in range(SMALL_RECORDS)])
        finally:
            small.close()
    return directory


def segment_path(storage: Path, first: int, suffix: str = fmt.SEGMENT_SUFFIX) -> Path:
    return storage / "0" / fmt.segment_file_name(first, suffix)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def write_index_entry(path: Path, position: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    start = fmt.HEADER_SIZE + position * fmt.INDEX_ENTRY_SIZE
    data[start : start + 8] = struct.pack(">q", value)
    path.write_bytes(bytes(data))


def waltz(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["disk", *(str(a) for a in args)])


def problem_lines(result: Result, severity: str) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith(severity + ":")]


# ---- verify ----


def test_verify_passes_on_a_clean_multi_segment_partition(storage: Path) -> None:
    assert len(list((storage / "0").glob("*.seg"))) == 4

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    assert "partition 0: PASSED (0 errors, 0 warnings): 4 segments, 25 records" in result.output
    assert "partition 2: PASSED (0 errors, 0 warnings): 1 segments, 3 records" in result.output
    assert f"storage {storage}: PASSED" in result.output
    assert not problem_lines(result, "ERROR") and not problem_lines(result, "WARNING")


@pytest.mark.parametrize(
    ("first", "position"),
    [(7, 3), (21, 1)],
    ids=["middle-of-sealed-segment", "last-segment"],
)
def test_verify_reports_a_flipped_data_byte(storage: Path, first: int, position: int) -> None:
    path = segment_path(storage, first)
    flip_byte(path, offset_of(position) + fmt.RECORD_HEADER_SIZE + 10)

    result = waltz("verify", storage)

    assert result.exit_code == 1, result.output
    errors = problem_lines(result, "ERROR")
    assert len(errors) == 1, result.output
    expected = (
        f"ERROR: partition 0, file {path}, offset {offset_of(position)}, transaction {first + position}:"
    )
    assert errors[0].startswith(expected), errors
    assert "CRC mismatch" in errors[0]
    assert "partition 0: FAILED (1 error, 0 warnings)" in result.output
    assert "partition 2: PASSED" in result.output
    assert f"storage {storage}: FAILED" in result.output


def test_verify_segment_reports_the_same_flipped_byte(storage: Path) -> None:
    path = segment_path(storage, 7)
    flip_byte(path, offset_of(3) + fmt.RECORD_HEADER_SIZE)

    result = waltz("verify-segment", path)

    assert result.exit_code == 1, result.output
    assert f"ERROR: partition 0, file {path}, offset {offset_of(3)}, transaction 10:" in result.output
    assert f"segment {path}: FAILED (1 error, 0 warnings): 6 records, transactions 7 to 13" in result.output
    clean = waltz("verify-segment", segment_path(storage, 14))
    assert clean.exit_code == 0, clean.output
    assert "PASSED (0 errors, 0 warnings): 7 records, transactions 14 to 20" in clean.output


def test_verify_reports_a_wrong_index_entry_of_a_sealed_segment(storage: Path) -> None:
    index = segment_path(storage, 7, fmt.INDEX_SUFFIX)
    write_index_entry(index, 2, 999)

    result = waltz("verify", storage)

    assert result.exit_code == 1, result.output
    assert problem_lines(result, "ERROR") == [
        f"ERROR: partition 0, file {index}, offset 144, transaction 9: "
        f"index entry 2 holds offset 999, the record is at offset {offset_of(2)}"
    ]


def test_a_wrong_index_entry_after_the_last_checkpoint_is_a_warning(storage: Path) -> None:
    index = segment_path(storage, 21, fmt.INDEX_SUFFIX)
    write_index_entry(index, 2, 999)

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    warnings = problem_lines(result, "WARNING")
    assert len(warnings) == 1, result.output
    assert warnings[0].startswith(f"WARNING: partition 0, file {index}, offset 144, transaction 23: ")
    assert "start-up rebuilds the index" in warnings[0]


def test_a_torn_tail_is_a_warning_and_nothing_is_modified(storage: Path) -> None:
    last = segment_path(storage, 21)
    end = last.stat().st_size
    with last.open("ab") as f:
        f.write(fmt.encode_record(record(25))[:50])  # an append that never completed
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in storage.rglob("*") if p.is_file()}

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    warnings = problem_lines(result, "WARNING")
    assert len(warnings) == 1, result.output
    assert warnings[0].startswith(
        f"WARNING: partition 0, file {last}, offset {end}, transaction 25: torn tail"
    )
    assert "partition 0: PASSED (0 errors, 1 warning)" in result.output
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in storage.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("cut", [0, RECORD_SIZE // 2], ids=["whole-record", "inside-the-record"])
def test_records_cut_below_the_local_low_water_mark_are_an_error(
    one_segment: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica that held transactions 0..9, flushed, when a store session set its low-water mark
    to 9, and whose last record is then gone (a damaged disk, a file copied back): verify fails,
    naming the lost range, and start-up logs it as an ERROR (before, verify passed with a torn-tail
    warning, and start-up cut an acknowledged, committed record without a word above WARNING)."""
    with ControlFile.open(one_segment) as control:
        partition = StoragePartition.create(one_segment / "0", 0, control)
        try:
            partition.set_low_water_mark(4, ONE_SEGMENT_RECORDS - 1)
        finally:
            partition.close()
    data = segment_path(one_segment, 0)
    last = offset_of(ONE_SEGMENT_RECORDS - 1)
    with data.open("r+b") as f:
        f.truncate(last + cut)

    result = waltz("verify", one_segment)

    assert result.exit_code == 1, result.output
    [error] = problem_lines(result, "ERROR")
    assert error.startswith(f"ERROR: partition 0, file {data}, offset {last}, transaction 9: "), error
    assert "below the local low-water mark 9" in error and "transactions 9..9 are lost" in error
    with (
        caplog.at_level(logging.ERROR, logger="waltz.services.storage.storage_partition"),
        started_partition(one_segment) as started,
    ):
        assert started.max_transaction_id == ONE_SEGMENT_RECORDS - 2
    assert [r.getMessage() for r in caplog.records if "are lost on this replica" in r.getMessage()] == [
        "partition 0: " + error.split("transaction 9: ", 1)[1]
    ]


@pytest.mark.parametrize("left", [None, 0, 10], ids=["segments-gone", "truncated-to-0", "truncated-to-10"])
def test_a_partition_without_records_below_its_local_low_water_mark_is_an_error(
    one_segment: Path, left: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica that held transactions 0..9, flushed, when a store session set its low-water mark
    to 9, and whose only segment is then gone or cut to less than a header: verify fails naming
    the lost range, as start-up logs it (before, verify passed with the warnings of an incomplete
    new segment or of a partition without segment files)."""
    with ControlFile.open(one_segment) as control:
        partition = StoragePartition.create(one_segment / "0", 0, control)
        try:
            partition.set_low_water_mark(4, ONE_SEGMENT_RECORDS - 1)
        finally:
            partition.close()
    data = segment_path(one_segment, 0)
    segment_path(one_segment, 0, fmt.INDEX_SUFFIX).unlink()
    if left is None:
        data.unlink()
    else:
        with data.open("r+b") as f:
            f.truncate(left)

    result = waltz("verify", one_segment)

    assert result.exit_code == 1, result.output
    assert "partition 0: FAILED (1 error" in result.output
    [error] = problem_lines(result, "ERROR")
    assert error.startswith(f"ERROR: partition 0, file {one_segment / '0'}, transaction 0: "), error
    assert "records end at transaction -1, below the local low-water mark 9" in error
    assert "transactions 0..9 are lost" in error
    with (
        caplog.at_level(logging.ERROR, logger="waltz.services.storage.storage_partition"),
        started_partition(one_segment) as started,
    ):
        assert started.max_transaction_id == -1
    assert [r.getMessage() for r in caplog.records if "are lost on this replica" in r.getMessage()] == [
        "partition 0: " + error.split("transaction 0: ", 1)[1]
    ]


def test_a_partition_restarted_at_its_cut_segment_s_first_transaction_loses_only_those_before_it(
    storage: Path,
) -> None:
    """Retention deleted the segments before 21 and the last one (21..24) is cut to a few bytes:
    start-up creates the first segment at 21 again, so transactions 21..24 are lost, not 0..24."""
    with ControlFile.open(storage) as control:
        partition = StoragePartition.create(storage / "0", 0, control, segment_size_threshold=THRESHOLD)
        try:
            partition.set_low_water_mark(4, RECORDS - 1)
        finally:
            partition.close()
    for first in (0, 7, 14):
        segment_path(storage, first).unlink()
        segment_path(storage, first, fmt.INDEX_SUFFIX).unlink()
    segment_path(storage, 21, fmt.INDEX_SUFFIX).unlink()
    segment_path(storage, 21).write_bytes(b"")

    result = waltz("verify", storage, "--partition", "0")

    assert result.exit_code == 1, result.output
    [error] = problem_lines(result, "ERROR")
    assert "records end at transaction 20, below the local low-water mark 24" in error, error
    assert "transactions 21..24 are lost" in error


def test_a_damaged_length_before_valid_records_is_corruption_not_a_torn_tail(storage: Path) -> None:
    last = segment_path(storage, 21)
    flip_byte(last, offset_of(1) + LENGTH_BYTE)  # the data length of transaction 22 now runs past the end

    result = waltz("verify", storage)

    assert result.exit_code == 1, result.output
    errors = problem_lines(result, "ERROR")
    assert len(errors) == 1 and errors[0].startswith(
        f"ERROR: partition 0, file {last}, offset {offset_of(1)}, transaction 22: corrupt record"
    ), result.output
    assert "not a torn tail" in errors[0]


@pytest.fixture
def one_segment(tmp_path: Path) -> Path:
    """A storage directory whose partition 0 holds one segment of 10 records (no index checkpoint)."""
    directory = tmp_path / "one-segment"
    directory.mkdir()
    with ControlFile.create(directory, CLUSTER_KEY, 1) as control:
        partition = StoragePartition.create(directory / "0", 0, control)
        try:
            partition.append([record(i) for i in range(ONE_SEGMENT_RECORDS)])
        finally:
            partition.close()
    return directory


@contextmanager
def started_partition(storage: Path) -> Iterator[StoragePartition]:
    """Open partition 0 as a storage node's start-up does (recovering its last segment)."""
    with ControlFile.open(storage) as control:
        partition = StoragePartition.create(storage / "0", 0, control)
        try:
            yield partition
        finally:
            partition.close()


def damage_index_entries(index: Path, entries: dict[int, int]) -> None:
    for position, value in entries.items():
        write_index_entry(index, position, value)


@pytest.mark.parametrize(
    ("damage_index", "damaged", "torn"),
    [
        # Entry 4 points to transaction 4's valid record: start-up keeps the records (corruption).
        (lambda index: None, 3, False),
        # The entries after the damaged record were never flushed (a crash before a checkpoint),
        # but transaction 4's valid record follows it in the data: corruption, nothing is cut.
        (lambda index: index.write_bytes(index.read_bytes()[: fmt.HEADER_SIZE + 3 * 8]), 3, False),
        # Entries 4, 5 and 6 are below the header, inside a record and past the end of the file;
        # the data still holds transaction 4 right after the damaged record.
        (lambda index: damage_index_entries(index, {4: 5, 5: offset_of(4) + 1, 6: 10**9}), 3, False),
        # The last record claims to run past the end and nothing follows it: a torn tail, cut.
        (lambda index: None, ONE_SEGMENT_RECORDS - 1, True),
    ],
    ids=["next-record-indexed", "index-entries-lost", "next-three-entries-unusable", "last-record"],
)
def test_verify_classifies_a_damaged_length_as_start_up_does(
    one_segment: Path, damage_index: Callable[[Path], None], damaged: int, torn: bool
) -> None:
    data = segment_path(one_segment, 0)
    size = data.stat().st_size
    flip_byte(data, offset_of(damaged) + LENGTH_BYTE)  # the record now claims to run past the end
    damage_index(segment_path(one_segment, 0, fmt.INDEX_SUFFIX))

    result = waltz("verify", one_segment)
    dump = waltz("segment", data)

    where = f"partition 0, file {data}, offset {offset_of(damaged)}, transaction {damaged}"
    with started_partition(one_segment) as partition:
        if torn:
            assert result.exit_code == 0, result.output
            assert any(w.startswith(f"WARNING: {where}: torn tail") for w in problem_lines(result, "WARNING"))
            assert f"(torn tail at offset {offset_of(damaged)}" in dump.output
            assert partition.corruption is None
            assert data.stat().st_size == offset_of(damaged), "start-up did not cut the torn tail"
            [kept] = data.parent.glob("*.tail-*")  # the cut bytes are kept beside the segment
            assert kept.stat().st_size == size - offset_of(damaged)
        else:
            assert result.exit_code == 1, result.output
            assert [e.split(": corrupt record")[0] for e in problem_lines(result, "ERROR")] == [
                f"ERROR: {where}"
            ], result.output
            assert f"(corrupt record at offset {offset_of(damaged)}" in dump.output
            assert "not a torn tail" in dump.output
            assert partition.corruption is not None
            assert (partition.corruption.transaction_id, partition.corruption.offset) == (
                damaged,
                offset_of(damaged),
            )
            assert data.stat().st_size == size, "start-up cut records after the damaged one"
    assert dump.exit_code == 0, dump.output


def test_a_damaged_length_before_the_last_checkpoint_is_corruption(one_segment: Path) -> None:
    data = segment_path(one_segment, 0)
    size = data.stat().st_size
    flip_byte(data, offset_of(3) + LENGTH_BYTE)
    damage_index_entries(segment_path(one_segment, 0, fmt.INDEX_SUFFIX), {4: 5, 5: 5, 6: 5})

    # With a checkpoint every 5 transactions, start-up trusts all 10 index entries and never
    # scans transaction 3: nothing is cut, and reading it fails.
    result = waltz("verify", one_segment, "--checkpoint-interval", "5")

    assert result.exit_code == 1, result.output
    errors = problem_lines(result, "ERROR")
    assert errors[0].startswith(
        f"ERROR: partition 0, file {data}, offset {offset_of(3)}, transaction 3: corrupt record"
    ), result.output
    assert "not a torn tail" in errors[0]
    with ControlFile.open(one_segment) as control:
        partition = StoragePartition.create(one_segment / "0", 0, control, checkpoint_interval=5)
        try:
            assert data.stat().st_size == size
            with pytest.raises(CorruptDataError):
                partition.read_records(3, 1)
        finally:
            partition.close()


def test_a_damaged_length_whose_next_records_the_index_misses_is_corruption(one_segment: Path) -> None:
    """The index's next three entries are unusable, but the data holds transaction 4 right after
    the damaged record: not a torn tail (start-up would otherwise cut seven acknowledged records)."""
    data = segment_path(one_segment, 0)
    flip_byte(data, offset_of(3) + LENGTH_BYTE)
    damage_index_entries(segment_path(one_segment, 0, fmt.INDEX_SUFFIX), {4: 5, 5: 5, 6: 5})

    report = inspect.verify_segment(data, partition_id=0, cluster_key=CLUSTER_KEY)

    (problem,) = [p for p in report.problems if p.path == data]
    assert problem.severity is inspect.Severity.ERROR
    assert (problem.offset, problem.transaction_id) == (offset_of(3), 3)
    with started_partition(one_segment) as partition:
        assert partition.corruption is not None and partition.corruption.transaction_id == 3
        assert data.stat().st_size == offset_of(ONE_SEGMENT_RECORDS)  # nothing cut


def test_verify_reports_a_broken_segment_chain(storage: Path) -> None:
    segment_path(storage, 7).unlink()
    segment_path(storage, 7, fmt.INDEX_SUFFIX).unlink()

    result = waltz("verify", storage, "--partition", "0")

    assert result.exit_code == 1, result.output
    assert (
        f"ERROR: partition 0, file {segment_path(storage, 14)}, offset 0, transaction 7: segment chain broken"
        in result.output
    )
    assert "partition 2" not in result.output


def test_a_new_segment_of_another_cluster_is_an_interrupted_roll(storage: Path) -> None:
    stray = segment_path(storage, RECORDS)
    header = fmt.SegmentHeader(fmt.FORMAT_VERSION, fmt.now_ms(), uuid.uuid4(), 0, RECORDS)
    stray.write_bytes(header.encode())

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    (warning,) = problem_lines(result, "WARNING")
    assert warning.startswith(f"WARNING: partition 0, file {stray}, offset 0: incomplete new segment")
    assert warning.endswith("start-up removes it")
    with started_partition(storage) as partition:
        assert not stray.exists() and partition.max_transaction_id == RECORDS - 1


def test_verify_ignores_a_directory_a_node_does_not_open(storage: Path) -> None:
    (storage / "00").mkdir()  # not a canonical partition ID: StorageNode.start ignores it

    result = waltz("verify", storage, "--partition", "0")

    assert result.exit_code == 0, result.output
    assert "partition 0: PASSED (0 errors, 0 warnings): 4 segments, 25 records" in result.output


def test_verify_json(storage: Path) -> None:
    flip_byte(segment_path(storage, 14), offset_of(0) + fmt.RECORD_HEADER_SIZE)

    result = waltz("verify", storage, "--json")

    assert result.exit_code == 1, result.output
    document = json.loads(result.output)
    assert (document["passed"], document["errors"], document["warnings"]) == (False, 1, 0)
    (partition0, partition2) = document["partitions"]
    assert (partition0["passed"], partition2["passed"]) == (False, True)
    assert [p["severity"] for p in partition2["problems"]] == []
    (problem,) = partition0["problems"]
    assert (problem["severity"], problem["offset"], problem["transaction_id"]) == ("ERROR", 128, 14)
    assert problem["path"] == str(segment_path(storage, 14))


def test_streaming_in_chunks_smaller_than_a_record_gives_the_same_report(storage: Path) -> None:
    flip_byte(segment_path(storage, 7), offset_of(3) + fmt.RECORD_HEADER_SIZE)
    with segment_path(storage, 21).open("ab") as f:
        f.write(b"\0" * 30)  # a zero-filled tail

    whole = inspect.verify_storage(storage)
    chunked = inspect.verify_storage(storage, chunk_size=7)

    assert chunked == whole
    assert [(p.severity, p.offset, p.transaction_id) for p in whole.partitions[0].problems] == [
        (inspect.Severity.ERROR, offset_of(3), 10),
        (inspect.Severity.WARNING, offset_of(4), 25),
    ]
    assert sum(s.records for s in whole.partitions[0].segments) == RECORDS - 1


# ---- control ----


def test_control_dumps_header_structs_and_fences(storage: Path) -> None:
    result = waltz("control", storage)

    assert result.exit_code == 0, result.output
    assert f"cluster key:     {cluster_key_fingerprint(CLUSTER_KEY)} (fingerprint)" in result.output
    assert str(CLUSTER_KEY) not in result.output
    assert "partitions:      3" in result.output
    assert "format version:  1" in result.output
    created = next(line for line in result.output.splitlines() if line.startswith("creation time:"))
    assert created.split()[2].endswith("Z")
    lines = result.output.splitlines()
    part0 = lines.index("partition 0 (entry at offset 128)")
    assert lines[part0 + 1].startswith("  struct 0 (offset 132): session ID -1, ")
    assert lines[part0 + 2] == (
        "  struct 1 (offset 160): session ID 3, low-water mark 20, local low-water mark 20, CRC OK"
        "  <- current"
    )
    assert lines[part0 + 3] == "  fence slot 0 (offset 308): session ID -1, CRC OK"
    assert lines[part0 + 5] == "  fence session ID: 3"


def test_control_shows_a_corrupt_struct(storage: Path) -> None:
    flip_byte(storage / fmt.CONTROL_FILE_NAME, 160 + 3)  # partition 0, struct 1 (the current one)

    result = waltz("control", storage)

    assert result.exit_code == 0, result.output
    assert "  struct 1 (offset 160): CORRUPT (CRC mismatch)" in result.output
    assert (
        "  struct 0 (offset 132): session ID -1, low-water mark -1, local low-water mark -1, CRC OK"
        "  <- current"
    ) in result.output
    as_json = json.loads(waltz("control", storage, "--json").output)
    entry = as_json["partitions"][0]
    assert entry["current_struct"] == 0 and entry["structs"][1]["info"] is None
    verify = waltz("verify", storage)
    assert verify.exit_code == 0, verify.output  # the node rolls back to struct 0: a warning
    assert any("partition-info struct 1 fails its CRC" in w for w in problem_lines(verify, "WARNING"))


# ---- stats ----


def test_stats_numbers(storage: Path) -> None:
    result = waltz("stats", storage, "--json")

    assert result.exit_code == 0, result.output
    by_partition = {row["partition_id"]: row for row in json.loads(result.output)}
    assert set(by_partition) == {0, 2}
    p0 = by_partition[0]
    assert (p0["segments"], p0["records"]) == (4, 25)
    assert (p0["first_transaction_id"], p0["max_transaction_id"], p0["archived_through"]) == (0, 24, -1)
    assert (p0["data_bytes"], p0["record_bytes"]) == (RECORDS * DATA_SIZE, RECORDS * RECORD_SIZE)
    assert p0["info"] == {"session_id": 3, "low_water_mark": 20, "local_low_water_mark": 20}
    p2 = by_partition[2]
    assert (p2["segments"], p2["records"], p2["max_transaction_id"], p2["data_bytes"]) == (1, 3, 2, 30)
    assert p2["info"]["session_id"] == -1

    text = waltz("stats", storage)
    assert text.exit_code == 0, text.output
    row = next(line.split() for line in text.output.splitlines() if line.split()[:1] == ["0"])
    assert row == ["0", "4", "25", "3500", "2500", "0", "24", "-1", "3", "20", "20", "3", "none"]


@pytest.mark.parametrize(
    ("asked", "words"),
    [
        (["1"], "partition 1: {storage} holds no such partition (it holds 0, 2)"),
        (["0", "9"], "partition 9: {storage} holds no such partition (it holds 0, 2; the cluster has 3)"),
    ],
    ids=["unassigned", "out-of-range"],
)
def test_stats_of_a_partition_the_directory_does_not_hold_is_refused(
    storage: Path, asked: list[str], words: str
) -> None:
    """As waltz disk dump refuses it (exit 2, naming what the directory holds), where stats printed
    an empty table (or the other partitions' rows alone) and exited 0."""
    for output in ([], ["--json"]):
        result = waltz("stats", storage, *[a for p in asked for a in ("--partition", p)], *output)

        assert result.exit_code == 2, result.output
        assert f"error: {words.format(storage=storage)}" in result.output
        assert "local lwm" not in result.output and "[" not in result.output


# ---- local start and retention file ----


def archive_and_delete(storage: Path, archived_through: int) -> None:
    """What a node with the policy ``archived`` does: keep archived-through, delete what it may."""
    with ControlFile.open(storage) as control:
        partition = StoragePartition.create(storage / "0", 0, control, segment_size_threshold=THRESHOLD)
        try:
            partition.set_archived_through(archived_through, archive="file:///archive", operator="ops")
            partition.apply_retention(RetentionSettings(RetentionPolicy.ARCHIVED, keep_seconds=0), 1e12)
        finally:
            partition.close()


def test_verify_and_stats_show_the_local_start_and_the_retention_file(storage: Path) -> None:
    archive_and_delete(storage, 15)  # segments 0-6 and 7-13 go; 14-20 holds 16..20, unarchived

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    assert not problem_lines(result, "WARNING"), result.output  # a chain may start above 0
    line = next(line for line in result.output.splitlines() if line.startswith("partition 0:"))
    assert (
        "PASSED (0 errors, 0 warnings): 2 segments, 11 records, local start 14, archived through 15" in line
    )
    assert "(retention.json: archive file:///archive, set by ops, at 20" in line
    assert "local start 0, archived through -1" in result.output  # partition 2: no retention file
    document = json.loads(waltz("verify", storage, "--json").output)
    (p0,) = [p for p in document["partitions"] if p["partition_id"] == 0]
    assert p0["retention"]["archived_through"] == 15 and p0["retention"]["archive"] == "file:///archive"
    rows = json.loads(waltz("stats", storage, "--json").output)
    assert [(r["partition_id"], r["first_transaction_id"], r["archived_through"]) for r in rows] == [
        (0, 14, 15),
        (2, 0, -1),
    ]


def test_a_damaged_retention_file_is_a_warning(storage: Path) -> None:
    archive_and_delete(storage, 15)
    (storage / "0" / "retention.json").write_text('{"form": 1, "kind": "waltz-storage-retention"')

    result = waltz("verify", storage)

    assert result.exit_code == 0, result.output
    (warning,) = problem_lines(result, "WARNING")
    assert "retention.json" in warning and "damaged" in warning and "takes archived-through as -1" in warning
    assert "local start 14, archived through -1" in result.output


# ---- segment dump ----


def test_segment_dump_lists_header_and_records(storage: Path) -> None:
    path = segment_path(storage, 7)

    result = waltz("segment", path, "--hex", "4")

    assert result.exit_code == 0, result.output
    assert "first transaction ID:  7" in result.output
    assert f"cluster key:           {cluster_key_fingerprint(CLUSTER_KEY)} (fingerprint)" in result.output
    assert str(CLUSTER_KEY) not in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(offset_of(i), 7 + i) for i in range(7)]
    assert rows[0][2:5] == ["1/2/0/7", "7", "100"] and rows[0][-1] == "07070707..."
    assert f"(end of file at offset {offset_of(7)}; 7 records listed)" in result.output


def test_segment_dump_from_transaction_with_limit(storage: Path) -> None:
    result = waltz("segment", segment_path(storage, 7), "--from-txn", "10", "--limit", "2")

    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[1]) for r in rows] == [10, 11]
    assert "(stopped after 2 records: --limit)" in result.output


# ---- partition dump ----


def test_a_dump_that_meets_a_corrupt_record_in_its_range_fails_naming_it(storage: Path) -> None:
    """A flipped data byte in transaction 10 (a sealed segment): a dump whose range reaches it lists
    the records before it and fails naming the file, offset and transaction (exit 2), where it
    stopped there without a word and exited 0; a range that ends before it is listed as before."""
    path = segment_path(storage, 7)
    flip_byte(path, offset_of(3) + fmt.RECORD_HEADER_SIZE + 5)  # transaction 10's data

    for arguments in ([], ["--from-txn", "8", "--to-txn", "12"]):
        result = waltz("dump", storage, "-p", "0", *arguments)

        assert result.exit_code == 2, result.output
        listed = [
            int(line.split()[0])
            for line in result.output.splitlines()
            if line.split()[:1] and line.split()[0].isdigit()
        ]
        assert listed == list(range(int(arguments[1]) if arguments else 0, 10)), result.output
        assert f"error: partition 0: a corrupt record at offset {offset_of(3)} of {path}" in result.output
        assert "where transaction 10 was due" in result.output
        assert f"waltz disk verify-segment {path}" in result.output
        assert "records listed" not in result.output

    before = waltz("dump", storage, "-p", "0", "--to-txn", "9")
    assert before.exit_code == 0, before.output
    assert "(10 records listed)" in before.output


def test_a_dump_says_the_records_on_disk_end_at_a_corrupt_record(storage: Path) -> None:
    """A flipped data byte in transaction 22 of the last segment: the header line says the records
    end at a corrupt record (last on disk 21, not 24 and not as though the disk ended there), and
    the default range, everything on disk, fails at it."""
    path = segment_path(storage, 21)
    flip_byte(path, offset_of(1) + fmt.RECORD_HEADER_SIZE + 5)

    held = inspect.partition_range(storage, 0, None)
    assert held.last_on_disk == 21
    assert held.corruption is not None and f"offset {offset_of(1)} of {path}" in held.corruption
    result = waltz("dump", storage, "-p", "0", "--from-txn", "20")

    assert result.exit_code == 2, result.output
    assert (
        f"partition 0: local start 0, last on disk 21, then a corrupt record at offset {offset_of(1)} of "
        f"{path} where transaction 22 was due"
    ) in result.output
    assert [line.split()[0] for line in result.output.splitlines()[2:4]] == ["20", "21"]
    assert "error: partition 0: a corrupt record" in result.output


# ---- unusable input ----


@pytest.mark.parametrize("command", ["control", "verify", "stats"])
def test_unknown_directory_is_exit_code_2(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nowhere"

    result = waltz(command, missing)

    assert result.exit_code == 2
    assert f"error: storage directory {missing} does not exist" in result.output
    assert "Traceback" not in result.output


def test_not_a_storage_directory_and_corrupt_header_are_exit_code_2(tmp_path: Path, storage: Path) -> None:
    empty = waltz("verify", tmp_path / "storage" / "0")
    assert empty.exit_code == 2
    assert "is not a storage directory" in empty.output

    control = storage / fmt.CONTROL_FILE_NAME
    data = bytearray(control.read_bytes())
    data[0:4] = struct.pack(">i", 99)
    control.write_bytes(bytes(data))
    corrupt = waltz("control", storage)
    assert corrupt.exit_code == 2
    assert "unknown control file format version 99" in corrupt.output

    absent = storage / "0" / "0000000000000000099.seg"
    for command in ("segment", "verify-segment"):
        missing = waltz(command, absent)
        assert missing.exit_code == 2
        assert f"error: segment file {absent} does not exist" in missing.output
    directory = waltz("segment", storage / "0")
    assert directory.exit_code == 2 and "is not a file" in directory.output


def test_every_command_has_help() -> None:
    for command in ("control", "segment", "verify", "verify-segment", "stats"):
        result = waltz(command, "--help")
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output


def test_a_lone_segment_cut_short_at_its_creation_is_a_warning_as_start_up_repairs_it(
    one_segment: Path,
) -> None:
    data = segment_path(one_segment, 0)
    data.write_bytes(data.read_bytes()[:60])  # a crash while the first segment's header was written
    segment_path(one_segment, 0, fmt.INDEX_SUFFIX).unlink()

    result = waltz("verify", one_segment)

    assert result.exit_code == 0, result.output
    first, second = problem_lines(result, "WARNING")
    assert first.startswith(f"WARNING: partition 0, file {data}, offset 0: incomplete new segment")
    assert second.endswith("no segment files; start-up creates the first segment")
    with started_partition(one_segment) as partition:
        assert partition.max_transaction_id == -1 and data.stat().st_size == fmt.HEADER_SIZE


@pytest.mark.parametrize(("interval", "written", "kept"), [(10, 25, 15), (1, 1, 0)])
def test_flushed_records_missing_from_the_data_file_are_an_error_and_their_index_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, interval: int, written: int, kept: int
) -> None:
    """The data is flushed before each index checkpoint, so a checkpoint entry beyond the end of
    the data file proves that flushed (acknowledged) records were lost: start-up logs an ERROR
    naming them and keeps the index that listed them, and verify fails, before and after."""
    directory = tmp_path / "lost"
    directory.mkdir()
    with ControlFile.create(directory, CLUSTER_KEY, 1) as control:
        partition = StoragePartition.create(directory / "0", 0, control, checkpoint_interval=interval)
        try:
            partition.append([record(i) for i in range(written)])
        finally:
            partition.close()
    data, index = segment_path(directory, 0), segment_path(directory, 0, fmt.INDEX_SUFFIX)
    listed = index.read_bytes()
    os.truncate(data, offset_of(kept))  # the flushed index lists the records cut off
    before = waltz("verify", directory, "--checkpoint-interval", str(interval))
    assert before.exit_code == 1, before.output
    assert any(f"{kept} to {written - 1}" in line for line in problem_lines(before, "ERROR")), before.output
    with ControlFile.open(directory) as control, caplog.at_level(logging.ERROR):
        partition = StoragePartition.create(directory / "0", 0, control, checkpoint_interval=interval)
        try:
            assert partition.max_transaction_id == kept - 1
        finally:
            partition.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"transactions {kept} to {written - 1}" in message for message in errors), errors
    copies = list((directory / "0").glob("*.lost-*"))
    assert [path.read_bytes() for path in copies] == [listed]
    after = waltz("verify", directory, "--checkpoint-interval", str(interval))
    assert after.exit_code == 1, after.output
    assert any(f"transactions from {kept} on" in line for line in problem_lines(after, "ERROR")), after.output
