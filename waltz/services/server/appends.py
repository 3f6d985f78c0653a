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
from waltz.protocol.split_records import SPLIT_RECORD_HEADER

__all__ = [
    "DEFAULT_MAX_LOCK_HASHES_PER_APPEND",
    "DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE",
    "MAX_ROWS_PER_MESSAGE",
    "AppendRow",
    "LockHashLimits",
    "append_rows",
    "reserved_header_refusal",
]

#: Lock hashes (WRITE, READ and APPEND together) one append may carry by default
#: (``server.maxLockHashesPerAppend``; docs/design/server.md, "Bounds on what a peer costs").
DEFAULT_MAX_LOCK_HASHES_PER_APPEND = 4_096
#: Lock hashes one ``AppendRequest`` or ``AppendRequests`` message may carry by default
#: (``server.maxLockHashesPerMessage``).
DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE = 16_384
#: Rows one ``AppendRequests`` message may carry: five times the most a waltz-py client puts in
#: one (its stream messages hold at most 2,000 protocol messages), so that a server builds a
#: bounded number of rows at once (docs/design/server.md, "Bounds on what a peer costs"); a
#: longer message is refused whole, before any row is built.
MAX_ROWS_PER_MESSAGE = 10_000


class LockHashLimits(NamedTuple):
    """The most lock hashes an append, and a message of appends, may carry (docs/design/server.md,
    "Bounds on what a peer costs"); more is refused before the lock table is touched."""

    per_append: int = DEFAULT_MAX_LOCK_HASHES_PER_APPEND
    per_message: int = DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE

    def refusal(self, request: client_pb2.AppendRequest) -> str | None:
        """Why an ``AppendRequest`` carries too many lock hashes, or None when it does not."""
        count = (
            len(request.write_lock_hashes) + len(request.read_lock_hashes) + len(request.append_lock_hashes)
        )
        limit = min(self.per_append, self.per_message)
        if count <= limit:
            return None
        return (
            f"the append carries {count} lock hashes, more than the {limit} a server takes "
            f"(server.maxLockHashesPerAppend {self.per_append}, server.maxLockHashesPerMessage "
            f"{self.per_message}): lock fewer, coarser things"
        )


def reserved_header_refusal(header: int) -> str | None:
    """Why a client may not append a transaction with this header, or None when it may.

    The records of a partition split carry :data:`~waltz.protocol.split_records.SPLIT_RECORD_HEADER`
    and are written by a partition's owner only, so a client's append with that header is refused
    before the lock table is touched: no client can forge a barrier or a genesis
    (docs/design/splits.md "Why no update is lost").

    Args:
        header: the 32-bit transaction header of a client's append.

    Returns:
        The reason to tell the client under the append's ReqId, or None.
    """
    if header != SPLIT_RECORD_HEADER:
        return None
    return (
        f"the header 0x{SPLIT_RECORD_HEADER:08X} is reserved for partition split records, which only "
        "a partition's owner writes: a client's append may not carry it; choose another header"
    )


class AppendRow(NamedTuple):
    """One append: its ReqId, the client's high-water mark, its lock hashes by kind (32-bit), the
    transaction header, the transaction data and its CRC-32 as the client sent it, the W3C
    ``traceparent`` of a traced transaction ("" when not traced; ``docs/protocol.md`` "Trace
    context"), and the partition epoch the client routed it by (0: the count at creation;
    ``docs/protocol.md`` "Partition epochs")."""

    req_id: ReqId
    client_high_water_mark: int
    write_hashes: tuple[int, ...]
    read_hashes: tuple[int, ...]
    append_hashes: tuple[int, ...]
    header: int
    data: bytes
    checksum: int
    traceparent: str = ""
    epoch: int = 0

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
            request.epoch,
        )


def append_rows(
    message: client_pb2.AppendRequests, limits: LockHashLimits | None = None
) -> tuple[list[AppendRow], list[tuple[AppendRow, str]]]:
    """The appends an ``AppendRequests`` carries, in order (``docs/protocol.md`` "Appends").

    Args:
        message: the message.
        limits: the most lock hashes per append and per message (default :class:`LockHashLimits`).

    Returns:
        The rows to append, in order, and the rows refused for carrying more lock hashes than
        ``limits.per_append`` or a header reserved for split records (:func:`reserved_header_refusal`),
        each with the reason (to tell the client under its ReqId).

    Raises:
        ValueError: the columns are empty or differ in length, a kind of lock hashes does not
            match its counts, there are trace contexts but not one per row, or the message
            carries more than ``limits.per_message`` lock hashes or more than
            :data:`MAX_ROWS_PER_MESSAGE` rows (the message says what); nothing of the message
            should be appended.
    """
    limits = limits or LockHashLimits()
    if len(message.seq_nums) > MAX_ROWS_PER_MESSAGE:
        raise ValueError(
            f"it carries {len(message.seq_nums)} rows, more than the {MAX_ROWS_PER_MESSAGE} a server "
            "takes in one message: send the appends in several messages"
        )
    hash_count = (
        len(message.write_lock_hashes) + len(message.read_lock_hashes) + len(message.append_lock_hashes)
    )
    if hash_count > limits.per_message:
        raise ValueError(
            f"it carries {hash_count} lock hashes, more than the {limits.per_message} a server takes in "
            "one message (server.maxLockHashesPerMessage): lock fewer, coarser things"
        )
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
    epoch = message.epoch  # one per message: every row was routed by it
    rows = [
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
            epoch,
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
    reserved = SPLIT_RECORD_HEADER in message.headers
    if not reserved and (hash_count <= limits.per_append or _most_per_row(message) <= limits.per_append):
        return rows, []  # no row can be refused (the common case: two checks per message)
    kept: list[AppendRow] = []
    refused: list[tuple[AppendRow, str]] = []
    for row in rows:
        locks = len(row.write_hashes) + len(row.read_hashes) + len(row.append_hashes)
        header_refusal = reserved_header_refusal(row.header) if reserved else None
        if header_refusal is not None:
            refused.append((row, header_refusal))
        elif locks > limits.per_append:
            reason = (
                f"the append carries {locks} lock hashes, more than the {limits.per_append} a server "
                "takes (server.maxLockHashesPerAppend): lock fewer, coarser things"
            )
            refused.append((row, reason))
        else:
            kept.append(row)
    return kept, refused


def _most_per_row(message: client_pb2.AppendRequests) -> int:
    """An upper bound of the lock hashes of one row: the sum of each kind's largest count."""
    return sum(
        max(counts, default=0)
        for counts in (message.write_lock_counts, message.read_lock_counts, message.append_lock_counts)
    )


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
