"""Append requests as the server handles them: one :class:`AppendRow` per append, read from an
``AppendRequest`` or from a row of the columns of an ``AppendRequests``.

Design: docs/design/server.md "Appends and the lock check" (the fields of an append);
``docs/protocol.md`` "Append" and "Appends" (the column form, not in upstream Waltz). A run of
appends travels as packed columns rather than nested messages, since reading columns costs the
server less per append (docs/decisions/0002-column-wire-forms.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import NamedTuple

from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId, unequal_columns

__all__ = ["AppendRow", "append_rows"]


class AppendRow(NamedTuple):
    """One append: its ReqId, the client's high-water mark, its lock hashes by kind (32-bit), the
    transaction header, the transaction data and its CRC-32 as the client sent it, and the W3C
    ``traceparent`` of a traced transaction ("" when not traced; ``docs/protocol.md`` "Trace
    context")."""

    req_id: ReqId
    client_high_water_mark: int
    write_hashes: tuple[int, ...]
    read_hashes: tuple[int, ...]
    append_hashes: tuple[int, ...]
    header: int
    data: bytes
    checksum: int
    traceparent: str = ""

    @classmethod
    def from_proto(cls, request: client_pb2.AppendRequest) -> AppendRow:
        """The append an ``AppendRequest`` carries."""
        return cls(
            ReqId.from_proto(request.req_id),
            request.client_high_water_mark,
            tuple(request.write_lock_hashes),
            tuple(request.read_lock_hashes),
            tuple(request.append_lock_hashes),
            request.header,
            request.data,
            request.checksum,
            request.traceparent,
        )


def append_rows(message: client_pb2.AppendRequests) -> list[AppendRow]:
    """The appends an ``AppendRequests`` carries, in order (``docs/protocol.md`` "Appends").

    Raises:
        ValueError: the columns are empty or differ in length, a kind of lock hashes does not
            match its counts, or there are trace contexts but not one per row (the message says
            what); nothing of the message should be appended.
    """
    seq_nums = message.seq_nums
    count = len(seq_nums)
    problem = unequal_columns(
        {
            "seq_nums": count,
            "client_high_water_marks": len(message.client_high_water_marks),
            "headers": len(message.headers),
            "data": len(message.data),
            "checksums": len(message.checksums),
        }
    )
    if problem is not None or count == 0:
        raise ValueError(f"its {problem or 'columns hold no row'}")
    writes = _split("write", message.write_lock_counts, message.write_lock_hashes, count)
    reads = _split("read", message.read_lock_counts, message.read_lock_hashes, count)
    appends = _split("append", message.append_lock_counts, message.append_lock_hashes, count)
    sent = message.traceparents
    if sent and len(sent) != count:
        raise ValueError(f"it has {len(sent)} traceparents for {count} rows")
    traceparents: Sequence[str] | repeat[str] = sent if sent else repeat("", count)
    client_id, generation, partition_id = message.client_id, message.generation, message.partition_id
    return [
        AppendRow(
            ReqId(client_id, generation, partition_id, seq),
            mark,
            write,
            read,
            append,
            header,
            data,
            crc,
            trace,
        )
        for seq, mark, write, read, append, header, data, crc, trace in zip(
            seq_nums,
            message.client_high_water_marks,
            writes,
            reads,
            appends,
            message.headers,
            message.data,
            message.checksums,
            traceparents,
            strict=False,  # the lengths are checked above; repeat() has no length
        )
    ]


def _split(
    kind: str, counts: Sequence[int], hashes: Sequence[int], rows: int
) -> Sequence[tuple[int, ...]] | repeat[tuple[int, ...]]:
    """Each row's lock hashes of one kind: ``hashes`` cut by ``counts`` (none at all without counts)."""
    if not counts:
        if hashes:
            raise ValueError(f"it has {len(hashes)} {kind} lock hash(es) but no {kind}_lock_counts")
        return repeat((), rows)
    if len(counts) != rows:
        raise ValueError(f"it has {len(counts)} {kind}_lock_counts for {rows} rows")
    counts = list(counts)
    hashes = list(hashes)
    if sum(counts) != len(hashes):
        raise ValueError(
            f"its {kind}_lock_counts add up to {sum(counts)}, but it has {len(hashes)} {kind} lock hashes"
        )
    if counts.count(1) == rows:  # one lock of the kind per row, the common case
        return [(h,) for h in hashes]
    split: list[tuple[int, ...]] = []
    position = 0
    for n in counts:
        split.append(tuple(hashes[position : position + n]))
        position += n
    return split
