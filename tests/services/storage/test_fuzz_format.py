"""Fuzzing the storage file codecs of ``waltz/services/storage/format.py`` (docs/format.md).

Every decoder gets arbitrary bytes and mutations of valid encodings. It must return a value or
raise its documented error (``CorruptDataError`` naming the file and offset, ``RecordProblem``
with a reason), never anything else; a corrupted record must never decode as a valid one; and a
length field announcing gigabytes must not allocate them.
"""

from __future__ import annotations

import struct
import tracemalloc
import uuid
import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings

from waltz.errors import CorruptDataError
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt

pytestmark = pytest.mark.fuzz

PATH = "/fuzz/waltz-storage.ctl"
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def records_strategy(max_records: int = 4) -> st.SearchStrategy[list[Record]]:
    """Consecutive valid records from a random first transaction ID."""
    return st.tuples(
        st.integers(0, 2**40),
        st.lists(st.tuples(INT32, INT32, INT32, INT32, INT32, st.binary(max_size=64)), max_size=max_records),
    ).map(
        lambda pair: [
            Record.create(pair[0] + i, ReqId(c, g, p, s), h, data)
            for i, (c, g, p, s, h, data) in enumerate(pair[1])
        ]
    )


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """Overwrite bytes at positions (modulo the length) and optionally cut the end off."""
    buffer = bytearray(data)
    for position, value in edits:
        if buffer:
            buffer[position % len(buffer)] = value
    if cut is not None and buffer:
        del buffer[cut % len(buffer) :]
    return bytes(buffer)


EDITS = st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=4)
CUT = st.none() | st.integers(0, 2**20)


# ---- the control file ------------------------------------------------------------------------------


def control_file(num_partitions: int, sessions: list[int]) -> bytes:
    header = fmt.ControlFileHeader(fmt.FORMAT_VERSION, 1_700_000_000_000, uuid.UUID(int=7), num_partitions)
    body = bytearray()
    for pid in range(num_partitions):
        info = (
            fmt.PartitionInfo(sessions[pid % len(sessions)], 3, 2) if sessions else fmt.INITIAL_PARTITION_INFO
        )
        struct_bytes = fmt.encode_partition_info_struct(pid, info)
        body += fmt.encode_partition_id(pid) + struct_bytes + struct_bytes
    for pid in range(num_partitions):
        body += fmt.encode_fence_slot(pid, 9) + fmt.encode_fence_slot(pid, -1)
    return header.encode() + bytes(body)


def check_control_file(data: bytes) -> None:
    try:
        header, entries = fmt.decode_control_file(data, PATH)
    except CorruptDataError as error:
        assert error.path == PATH and PATH in str(error)
        return
    assert header.version == fmt.FORMAT_VERSION and header.num_partitions >= 0
    assert len(data) >= fmt.control_file_size(header.num_partitions)
    assert [e.partition_id for e in entries] == list(range(header.num_partitions))
    for entry in entries:
        if entry.stored_partition_id != entry.partition_id:
            assert entry.structs == (None, None)


@fuzz_settings()
@given(st.binary(max_size=600))
@example(b"")
@example(struct.pack(">iq16si", 1, 0, b"\0" * 16, 2**31 - 1).ljust(128, b"\0"))  # 2^31 partitions
@example(struct.pack(">iq16si", 1, 0, b"\0" * 16, -1).ljust(128, b"\0"))
def test_control_file_from_arbitrary_bytes(data: bytes) -> None:
    check_control_file(data)


@fuzz_settings()
@given(st.integers(0, 6), st.lists(st.integers(-1, 2**62), max_size=3), EDITS, CUT)
def test_control_file_mutations(
    num_partitions: int, sessions: list[int], edits: list[tuple[int, int]], cut: int | None
) -> None:
    data = control_file(num_partitions, sessions)
    mutated = mutate(data, edits, cut)
    check_control_file(mutated)
    if mutated[:128] == data[:128] and len(mutated) == len(data):
        # Only the body or fences changed: every struct either decodes to what was written or
        # is rejected by its CRC; damage never yields another valid value.
        _, original = fmt.decode_control_file(data, PATH)
        _, damaged = fmt.decode_control_file(mutated, PATH)
        for before, after in zip(original, damaged, strict=True):
            for old, new in zip(before.structs + before.fences, after.structs + after.fences, strict=True):
                assert new is None or new == old


def test_a_huge_partition_count_allocates_nothing() -> None:
    """A header announcing 2^31 - 1 partitions in a short file fails before building anything."""
    data = struct.pack(">iq16si", 1, 0, b"\0" * 16, 2**31 - 1).ljust(128 + 84, b"\0")
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match="partitions need") as error:
            fmt.decode_control_file(data, PATH)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert error.value.path == PATH


# ---- segment headers, records, index entries ------------------------------------------------------


@fuzz_settings()
@given(st.binary(max_size=200))
def test_segment_header_from_arbitrary_bytes(data: bytes) -> None:
    try:
        header = fmt.SegmentHeader.decode(data, "/fuzz/0/0000000000000000000.seg")
    except CorruptDataError as error:
        assert error.path == "/fuzz/0/0000000000000000000.seg" and error.offset == 0
        return
    assert header.version == fmt.FORMAT_VERSION
    # The reserved bytes are ignored: the fields re-encode to the first 40 bytes.
    assert header.encode() == data[:40].ljust(128, b"\0")


@fuzz_settings()
@given(st.binary(max_size=300), st.integers(0, 320))
@example(b"\0" * 10, 0)
@example(struct.pack(">qiiiiiiI", 0, 0, 0, 0, 0, 0, 2**31 - 1, 0), 0)  # a 2 GiB data length
@example(struct.pack(">qiiiiiiI", 0, 0, 0, 0, 0, 0, -1, 0), 0)
@example(struct.pack(">qiiiiiiI", 0, 0, 0, 0, 0, 0, fmt.MAX_DATA_LENGTH, 0), 0)
def test_record_decoders_from_arbitrary_bytes(data: bytes, position: int) -> None:
    try:
        record, size = fmt.decode_record_at(data, position)
    except fmt.RecordProblem as problem:
        assert problem.reason
    else:
        assert size == fmt.RECORD_FIXED_SIZE + len(record.data) <= len(data) - position
        assert record.checksum_ok()
        assert fmt.encode_record(record) == data[position : position + size]
    try:
        size = fmt.record_size(data[position:])
    except fmt.RecordProblem as problem:
        assert problem.reason
    else:
        assert fmt.RECORD_FIXED_SIZE <= size <= fmt.RECORD_FIXED_SIZE + fmt.MAX_DATA_LENGTH
    try:
        header = fmt.decode_record_header_at(data, position)
    except fmt.RecordProblem as problem:
        assert problem.incomplete and len(data) - position < fmt.RECORD_HEADER_SIZE
    else:
        assert header.transaction_id == struct.unpack_from(">q", data, position)[0]
    try:
        decoded = list(fmt.iter_records(data, position))
    except fmt.RecordProblem:
        pass
    else:
        assert all(r.checksum_ok() for _, r in decoded)


@fuzz_settings()
@given(records_strategy(), EDITS, CUT)
def test_damaged_records_never_decode_as_other_valid_records(
    records: list[Record], edits: list[tuple[int, int]], cut: int | None
) -> None:
    encoded, _ = fmt.encode_records(records)
    assert [r for _, r in fmt.iter_records(encoded)] == records
    damaged = mutate(encoded, edits, cut)
    decoded: list[Record] = []
    try:
        for _, record in fmt.iter_records(damaged):
            decoded.append(record)
    except fmt.RecordProblem as problem:
        assert problem.reason
    # A change passes the record CRC and the data CRC by chance with odds of about 2^-64: what
    # still decodes is an unchanged record.
    originals = {fmt.encode_record(r) for r in records}
    for record in decoded:
        assert fmt.encode_record(record) in originals


@fuzz_settings()
@given(st.binary(max_size=200))
def test_index_entries_from_arbitrary_bytes(data: bytes) -> None:
    offsets = fmt.decode_offsets(data)
    assert len(offsets) == len(data) // 8
    assert b"".join(fmt.encode_offset(o) for o in offsets) == data[: len(offsets) * 8]


@fuzz_settings()
@given(st.lists(st.integers(0, 2**40), max_size=300), st.integers(0, 2**40))
def test_a_run_of_index_entries_is_each_entry_in_turn(offsets: list[int], base: int) -> None:
    """``encode_offsets`` (the append path's, one pack per run) is ``encode_offset`` of each."""
    encoded = fmt.encode_offsets(offsets, base)
    assert encoded == b"".join(fmt.encode_offset(base + o) for o in offsets)
    assert fmt.decode_offsets(encoded) == [base + o for o in offsets]


@pytest.mark.parametrize("length", [fmt.MAX_DATA_LENGTH, fmt.MAX_DATA_LENGTH + 1, 2**31 - 1])
def test_a_huge_data_length_allocates_nothing(length: int) -> None:
    """A record header announcing up to 2 GiB in a 100-byte buffer is refused without copying."""
    head = struct.pack(">qiiiiiiI", 0, 1, 1, 0, 1, 0, length, zlib.crc32(b""))
    buffer = head + b"x" * 64
    tracemalloc.start()
    try:
        with pytest.raises(fmt.RecordProblem) as problem:
            fmt.decode_record_at(buffer, 0)
        if length > fmt.MAX_DATA_LENGTH:
            with pytest.raises(fmt.RecordProblem, match="impossible data length"):
                fmt.record_size(head)
        else:
            assert fmt.record_size(head) == fmt.RECORD_FIXED_SIZE + length
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert problem.value.incomplete == (length <= fmt.MAX_DATA_LENGTH)


@fuzz_settings()
@given(
    st.lists(st.tuples(INT64, INT32, INT32, INT32, INT32, INT32, st.binary(max_size=32)), max_size=5),
    st.integers(-5, 5),
)
def test_wire_records_are_checked_before_encoding(
    fields: list[tuple[int, int, int, int, int, int, bytes]], first_shift: int
) -> None:
    """``encode_wire_records`` (the append path) refuses IDs out of order and bad checksums."""
    from waltz.protocol import common_pb2

    wire = [
        common_pb2.Record(
            transaction_id=txn,
            req_id=common_pb2.ReqId(client_id=c, generation=g, partition_id=p, seq_num=s),
            header=h,
            data=data,
            checksum=zlib.crc32(data) ^ (1 if txn % 7 == 0 else 0),
        )
        for txn, c, g, p, s, h, data in fields
    ]
    first = (fields[0][0] if fields else 0) + first_shift
    try:
        encoded, offsets = fmt.encode_wire_records(wire, first)
    except fmt.RecordOrderError as error:
        assert "expected" in str(error) or "checksum" in str(error)
        return
    assert [r.transaction_id for _, r in fmt.iter_records(encoded)] == list(range(first, first + len(wire)))
    assert len(offsets) == len(wire)


@fuzz_settings()
@given(
    st.lists(st.tuples(INT32, INT32, INT32, INT32, st.binary(max_size=32)), min_size=1, max_size=5),
    st.integers(0, 2**63 - 6),  # the first of up to 5 transaction IDs
    INT32,
    st.sampled_from(["client_ids", "generations", "seq_nums", "headers", "data", "checksums", None]),
)
def test_record_columns_encode_as_the_same_records_do(
    fields: list[tuple[int, int, int, int, bytes]], first: int, partition_id: int, shorter: str | None
) -> None:
    """``AppendRequest.columns`` (storage.proto ``RecordColumns``) is the same records as messages:
    the same bytes on disk; columns of different lengths are refused."""
    from waltz.protocol import common_pb2, storage_pb2

    records = [
        common_pb2.Record(
            transaction_id=first + i,
            req_id=common_pb2.ReqId(client_id=c, generation=g, partition_id=partition_id, seq_num=s),
            header=h,
            data=data,
            checksum=zlib.crc32(data),
        )
        for i, (c, g, s, h, data) in enumerate(fields)
    ]
    columns = storage_pb2.RecordColumns(
        first_transaction_id=first,
        client_ids=[f[0] for f in fields],
        generations=[f[1] for f in fields],
        seq_nums=[f[2] for f in fields],
        headers=[f[3] for f in fields],
        data=[f[4] for f in fields],
        checksums=[zlib.crc32(f[4]) for f in fields],
    )
    if shorter is not None:
        del getattr(columns, shorter)[-1]
        with pytest.raises(fmt.RecordOrderError, match=f"differ in length.*{shorter} {len(fields) - 1}"):
            fmt.encode_wire_rows(fmt.column_rows(columns, partition_id), first)
        return
    assert fmt.encode_wire_rows(fmt.column_rows(columns, partition_id), first) == fmt.encode_wire_records(
        records, first
    )
