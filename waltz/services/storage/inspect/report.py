"""What checking a storage node's files finds: problems, their severity, and the reports.

Design: docs/design/storage.md "Files on disk"; ``docs/format.md``. These are the values that
:mod:`waltz.services.storage.inspect.verify` returns and ``waltz disk`` prints (as text or JSON):
frozen dataclasses whose fields are the JSON fields.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import ControlFileDump
from waltz.services.storage.retention_file import RetentionRecord

__all__ = [
    "PartitionReport",
    "PartitionSummary",
    "Problem",
    "SegmentReport",
    "Severity",
    "StorageReport",
]


class Severity(enum.Enum):
    """How bad a problem is: an ERROR fails verification, a WARNING is repaired at start-up."""

    ERROR = "ERROR"
    WARNING = "WARNING"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of the verifier.

    Attributes:
        severity: ERROR or WARNING.
        message: what is wrong, with the values involved.
        path: the file (or directory) concerned.
        partition_id: the partition, -1 when not known.
        offset: byte offset in ``path``, -1 when not applicable.
        transaction_id: the transaction involved, -1 when not known.
    """

    severity: Severity
    message: str
    path: Path
    partition_id: int = -1
    offset: int = -1
    transaction_id: int = -1

    def describe(self) -> str:
        """Return one human-readable line: severity, partition, file, offset, transaction, message."""
        where = [f"partition {self.partition_id}"] if self.partition_id >= 0 else []
        where.append(f"file {self.path}")
        if self.offset >= 0:
            where.append(f"offset {self.offset}")
        if self.transaction_id >= 0:
            where.append(f"transaction {self.transaction_id}")
        return f"{self.severity.value}: {', '.join(where)}: {self.message}"


def count_problems(problems: Sequence[Problem], severity: Severity) -> int:
    """Return how many of ``problems`` have ``severity``."""
    return sum(1 for p in problems if p.severity is severity)


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """What ``verify_segment`` found in one segment.

    Attributes:
        path: the data file.
        header: its header, None when it does not decode.
        is_last: whether it was judged as the partition's last segment (recovered at start-up).
        file_size: the data file's size in bytes.
        records: valid records.
        transactions: transaction IDs the segment covers: valid records plus unreadable ones that
            were skipped with the help of the index.
        record_bytes: bytes taken by the valid records (headers, data and CRCs).
        data_bytes: bytes of transaction data in the valid records.
        valid_end: the offset just after the last valid record.
        index_entries: entries in the index file (0 when it is missing or invalid).
        complete: the scan reached the end of the file (or a torn tail) rather than stopping at an
            unreadable record.
        problems: what is wrong, in file order.
    """

    path: Path
    header: fmt.SegmentHeader | None
    is_last: bool
    file_size: int
    records: int = 0
    transactions: int = 0
    record_bytes: int = 0
    data_bytes: int = 0
    valid_end: int = 0
    index_entries: int = 0
    complete: bool = False
    problems: tuple[Problem, ...] = ()

    @property
    def first_transaction_id(self) -> int:
        """The first transaction ID of the header (-1 without a header)."""
        return -1 if self.header is None else self.header.first_transaction_id

    @property
    def max_transaction_id(self) -> int:
        """The last transaction ID the segment covers (first - 1 when empty)."""
        return self.first_transaction_id + self.transactions - 1

    @property
    def errors(self) -> int:
        """The number of ERROR problems."""
        return count_problems(self.problems, Severity.ERROR)


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What ``verify_partition`` found in one partition directory.

    Attributes:
        partition_id: the partition.
        directory: its directory.
        segments: one report per segment, in transaction order.
        problems: every problem of the partition (its control file entry, its directory, its
            segments and its retention file), in the order found.
        retention: its retention file (``retention.json``: docs/format.md), None when there is none
            or it is damaged (then a problem says why).
    """

    partition_id: int
    directory: Path
    segments: tuple[SegmentReport, ...]
    problems: tuple[Problem, ...]
    retention: RetentionRecord | None = None

    @property
    def local_start(self) -> int:
        """The first transaction ID on disk: the first segment's (0 without a readable segment)."""
        firsts = [s.first_transaction_id for s in self.segments if s.header is not None]
        return firsts[0] if firsts else 0

    @property
    def archived_through(self) -> int:
        """The archived-through the node takes from the retention file (-1: none or damaged)."""
        return -1 if self.retention is None else self.retention.archived_through

    @property
    def errors(self) -> int:
        """The number of ERROR problems."""
        return count_problems(self.problems, Severity.ERROR)

    @property
    def warnings(self) -> int:
        """The number of WARNING problems."""
        return count_problems(self.problems, Severity.WARNING)

    @property
    def passed(self) -> bool:
        """True when no ERROR was found."""
        return self.errors == 0


@dataclass(frozen=True, slots=True)
class StorageReport:
    """What ``verify_storage`` found in a storage directory.

    Attributes:
        directory: the storage directory.
        control: the decoded control file.
        partitions: one report per verified partition, by partition ID.
        problems: problems outside the verified partitions (control file, stray directories).
    """

    directory: Path
    control: ControlFileDump
    partitions: tuple[PartitionReport, ...]
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> int:
        """The number of ERROR problems, in partitions and outside them."""
        return count_problems(self.problems, Severity.ERROR) + sum(p.errors for p in self.partitions)

    @property
    def warnings(self) -> int:
        """The number of WARNING problems, in partitions and outside them."""
        return count_problems(self.problems, Severity.WARNING) + sum(p.warnings for p in self.partitions)

    @property
    def passed(self) -> bool:
        """True when no ERROR was found."""
        return self.errors == 0


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """Statistics of one partition (``waltz disk stats``).

    Attributes:
        partition_id: the partition.
        segments: segment files.
        records: valid records.
        record_bytes: bytes of the valid records on disk (what ``PartitionStats.record_bytes`` counts).
        data_bytes: bytes of transaction data in the valid records.
        first_transaction_id: the first segment's first transaction ID, the partition's local start
            (0 without segments).
        max_transaction_id: the last transaction ID stored (``first_transaction_id - 1`` when empty).
        archived_through: what the retention file says is archived (-1: none, or it is damaged).
        info: the current partition info of the control file (None when both structs are corrupt).
        fence: the effective fence session ID.
        errors: ERROR problems found while reading (see ``waltz disk verify``).
        warnings: WARNING problems found while reading.
    """

    partition_id: int
    segments: int
    records: int
    record_bytes: int
    data_bytes: int
    first_transaction_id: int
    max_transaction_id: int
    archived_through: int
    info: fmt.PartitionInfo | None
    fence: int
    errors: int
    warnings: int
