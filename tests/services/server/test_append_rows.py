"""Reading an AppendRequests into rows (waltz.services.server.appends, docs/protocol.md "Appends")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER
from waltz.services.server.appends import AppendRow, LockHashLimits, append_rows, reserved_header_refusal

I32 = st.integers(-(2**31), 2**31 - 1)
LOCKS = st.lists(I32, max_size=3).map(tuple)
ROW = st.tuples(
    st.integers(0, 2**31 - 1), st.integers(-1, 2**40), LOCKS, LOCKS, LOCKS, I32, st.binary(max_size=8)
)
#: seq_num, client high-water mark, write, read and append lock hashes, header, data.
Row = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int, bytes]
#: A W3C trace context (docs/protocol.md "Trace context").
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def columns(rows: list[Row]) -> client_pb2.AppendRequests:
    message = client_pb2.AppendRequests(client_id=7, generation=3, partition_id=1)
    for seq, mark, write, read, append, header, data in rows:
        message.seq_nums.append(seq)
        message.client_high_water_marks.append(mark)
        message.headers.append(header)
        message.data.append(data)
        message.checksums.append(len(data))
        for counts, hashes, locks in (
            (message.write_lock_counts, message.write_lock_hashes, write),
            (message.read_lock_counts, message.read_lock_hashes, read),
            (message.append_lock_counts, message.append_lock_hashes, append),
        ):
            counts.append(len(locks))
            hashes.extend(locks)
    return message


@given(st.lists(ROW, min_size=1, max_size=6), st.booleans())
def test_rows_are_the_columns_read_back(rows: list[Row], drop_empty_counts: bool) -> None:
    message = columns(rows)
    if drop_empty_counts:  # a kind no row has may come without counts
        for counts, hashes in (
            (message.write_lock_counts, message.write_lock_hashes),
            (message.read_lock_counts, message.read_lock_hashes),
            (message.append_lock_counts, message.append_lock_hashes),
        ):
            if not hashes:
                del counts[:]
    assert append_rows(message) == (
        [
            AppendRow(ReqId(7, 3, 1, seq), mark, write, read, append, header, data, len(data))
            for seq, mark, write, read, append, header, data in rows
        ],
        [],
    )


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda m: m.headers.append(1), "columns differ in length"),
        (lambda m: m.data.pop(), "columns differ in length"),
        (lambda m: m.write_lock_hashes.append(5), "add up to"),
        (lambda m: m.read_lock_counts.append(0), "read_lock_counts for 2 rows"),
        (lambda m: (m.append_lock_hashes.append(5), m.ClearField("append_lock_counts")), "no append_lock"),
        (lambda m: m.traceparents.append(TRACEPARENT), "1 traceparents for 2 rows"),
    ],
)
def test_malformed_columns_are_refused(damage, says: str) -> None:  # type: ignore[no-untyped-def]
    message = columns([(1, 0, (9,), (), (), 0, b"a"), (2, 0, (8, 7), (), (), 0, b"b")])
    damage(message)
    with pytest.raises(ValueError, match=says):
        append_rows(message)


def test_trace_contexts_go_with_their_rows() -> None:
    message = columns([(1, 0, (), (), (), 0, b"a"), (2, 0, (), (), (), 0, b"b")])
    assert [row.traceparent for row in append_rows(message)[0]] == ["", ""]
    message.traceparents.extend(["", TRACEPARENT])
    assert [row.traceparent for row in append_rows(message)[0]] == ["", TRACEPARENT]


def test_no_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="no row"):
        append_rows(client_pb2.AppendRequests(client_id=7))


def test_an_append_with_too_many_lock_hashes_is_refused_alone() -> None:
    message = columns(
        [(1, 0, (9,), (), (), 0, b"a"), (2, 0, (8, 7, 6), (5,), (), 0, b"b"), (3, 0, (4,), (), (3,), 0, b"c")]
    )
    kept, refused = append_rows(message, LockHashLimits(per_append=3, per_message=100))
    assert [row.req_id.seq_num for row in kept] == [1, 3]
    ((row, reason),) = refused
    assert row.req_id.seq_num == 2
    assert "4 lock hashes, more than the 3" in reason and "server.maxLockHashesPerAppend" in reason


def test_an_append_with_the_split_records_header_is_refused_alone() -> None:
    """docs/design/splits.md "Why no update is lost": no client can forge a barrier or a genesis."""
    rows: list[Row] = [(1, -1, (1,), (), (), 7, b"a"), (2, -1, (), (), (), SPLIT_RECORD_HEADER, b"b")]
    rows.append((3, -1, tuple(range(5)), (), (), 7, b"c"))
    kept, refused = append_rows(columns(rows), LockHashLimits(per_append=3, per_message=100))
    assert [row.req_id.seq_num for row in kept] == [1]
    assert [row.req_id.seq_num for row, _ in refused] == [2, 3]
    assert "the header 0x57505348 is reserved for partition split records" in refused[0][1]
    assert "5 lock hashes, more than the 3" in refused[1][1]
    assert reserved_header_refusal(7) is None and reserved_header_refusal(SPLIT_RECORD_HEADER + 1) is None


def test_a_message_with_too_many_lock_hashes_is_refused_whole() -> None:
    message = columns([(1, 0, (9,), (), (), 0, b"a"), (2, 0, (8, 7), (6,), (5,), 0, b"b")])
    with pytest.raises(ValueError, match=r"5 lock hashes, more than the 4 .*server.maxLockHashesPerMessage"):
        append_rows(message, LockHashLimits(per_append=4, per_message=4))


def test_a_single_append_over_the_limits_is_refused() -> None:
    request = client_pb2.AppendRequest(write_lock_hashes=[1, 2], read_lock_hashes=[3], append_lock_hashes=[4])
    assert LockHashLimits(per_append=4, per_message=10).refusal(request) is None
    assert "4 lock hashes, more than the 3" in (
        LockHashLimits(per_append=3, per_message=10).refusal(request) or ""
    )
    assert "more than the 2" in (LockHashLimits(per_append=10, per_message=2).refusal(request) or "")
