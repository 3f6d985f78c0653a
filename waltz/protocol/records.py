"""Value types of the log: ReqId, record headers and records, with their protobuf conversions.

Design: docs/design/client.md "ReqId and identities"; docs/design/storage.md "Segments and index
files" (records and their headers).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import NamedTuple

from waltz.protocol import common_pb2

__all__ = ["MAX_PARTITIONS", "Record", "RecordHeader", "ReqId", "crc32", "unequal_columns"]

#: Partitions a cluster may have at most (a storage node refuses to be initialised with more).
MAX_PARTITIONS = 65_536


def crc32(data: bytes | bytearray | memoryview) -> int:
    """Return the CRC-32 (IEEE 802.3, as ``java.util.zip.CRC32``) of ``data`` as an unsigned int."""
    return zlib.crc32(data) & 0xFFFFFFFF


def unequal_columns(lengths: Mapping[str, int]) -> str | None:
    """Why the columns of a message in column form (``FeedEntries``, ``AppendRequests``,
    ``RecordColumns``) do not make rows: None when every column is as long as the first.

    Args:
        lengths: each column's name and length, in the message's order.
    """
    counts = list(lengths.values())
    if all(count == counts[0] for count in counts):
        return None
    return "columns differ in length: " + ", ".join(f"{name} {count}" for name, count in lengths.items())


class ReqId(NamedTuple):
    """A request ID: client ID, generation, partition ID and sequence number, each a 32-bit int.

    Design: docs/design/client.md "ReqId and identities". A named tuple (immutable, hashed and
    compared in C): the client and the server make one or two per transaction.
    """

    client_id: int
    generation: int
    partition_id: int
    seq_num: int

    def to_proto(self) -> common_pb2.ReqId:
        """Return the protobuf form of this ReqId."""
        return common_pb2.ReqId(
            client_id=self.client_id,
            generation=self.generation,
            partition_id=self.partition_id,
            seq_num=self.seq_num,
        )

    @classmethod
    def from_proto(cls, message: common_pb2.ReqId) -> ReqId:
        """Build a ReqId from its protobuf form."""
        return cls(message.client_id, message.generation, message.partition_id, message.seq_num)


class RecordHeader(NamedTuple):
    """The header of a transaction record: transaction ID, ReqId and 32-bit transaction header.

    Design: docs/design/storage.md "Segments and index files". A named tuple, like :class:`ReqId`.
    """

    transaction_id: int
    req_id: ReqId
    header: int

    def to_proto(self) -> common_pb2.RecordHeader:
        """Return the protobuf form of this record header."""
        return common_pb2.RecordHeader(
            transaction_id=self.transaction_id, req_id=self.req_id.to_proto(), header=self.header
        )

    @classmethod
    def from_proto(cls, message: common_pb2.RecordHeader) -> RecordHeader:
        """Build a record header from its protobuf form."""
        return cls(message.transaction_id, ReqId.from_proto(message.req_id), message.header)


class Record(NamedTuple):
    """A transaction record: header fields, the opaque transaction data and its CRC-32.

    Design: docs/design/storage.md "Segments and index files". ``checksum`` is the CRC-32 of
    ``data`` as sent by the writer; use :meth:`checksum_ok` to verify it. A named tuple, like
    :class:`ReqId` (the server makes one per committed transaction).
    """

    transaction_id: int
    req_id: ReqId
    header: int
    data: bytes
    checksum: int

    @classmethod
    def create(cls, transaction_id: int, req_id: ReqId, header: int, data: bytes) -> Record:
        """Build a record and compute the CRC-32 of its data."""
        return cls(transaction_id, req_id, header, data, crc32(data))

    def checksum_ok(self) -> bool:
        """Return True when ``checksum`` is the CRC-32 of ``data``."""
        return crc32(self.data) == self.checksum

    @property
    def record_header(self) -> RecordHeader:
        """The header part of this record."""
        return RecordHeader(self.transaction_id, self.req_id, self.header)

    def to_proto(self) -> common_pb2.Record:
        """Return the protobuf form of this record."""
        return common_pb2.Record(
            transaction_id=self.transaction_id,
            req_id=self.req_id.to_proto(),
            header=self.header,
            data=self.data,
            checksum=self.checksum,
        )

    @classmethod
    def from_proto(cls, message: common_pb2.Record) -> Record:
        """Build a record from its protobuf form (the checksum is copied, not verified)."""
        return cls(
            message.transaction_id,
            ReqId.from_proto(message.req_id),
            message.header,
            message.data,
            message.checksum,
        )
