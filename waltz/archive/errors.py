"""Errors of the archive (all :class:`~waltz.errors.WaltzError`).

Source: docs/design/archive.md "The archive's layout and forms", "The archiver". A problem with a
file of the archive names the file and the range of transactions it holds, so that an operator
can find it and ``waltz archive verify`` can report it.
"""

from __future__ import annotations

from waltz.errors import WaltzError

__all__ = [
    "ArchiveCheckError",
    "ArchiveError",
    "ArchiveFormError",
    "ArchiveFormTooNewError",
    "ArchiveRefusedError",
    "ArchiveUnreadableError",
    "ArchiveUnwritableError",
    "ReplicaMismatchError",
]


class ArchiveError(WaltzError):
    """The archive cannot be written or read as it should."""


class ArchiveFormError(ArchiveError):
    """``archive.json`` or a partition's ``manifest.json`` is not JSON, not of its kind, of a form
    newer than this waltz-py reads, or lacks a field (the message names the file)."""


class ArchiveUnreadableError(ArchiveError):
    """A manifest of the archive exists but cannot be read: the location refused it (its
    permissions, a directory or a file where a directory should be, an I/O error of a disk or an
    object store). The message names the file and the location's reason."""


class ArchiveUnwritableError(ArchiveError):
    """A manifest of the archive cannot be written: the location refused it (a path under a
    regular file or a read-only filesystem, its permissions, a full disk, an object store's
    error). The message names the file and the location's reason; ``waltz archive`` exits 2, as
    for a location that cannot be opened (docs/design/archive.md, "The archive's layout and
    forms")."""


class ArchiveFormTooNewError(ArchiveFormError):
    """A manifest of a form newer than this waltz-py reads: upgrade waltz-py."""


class ArchiveCheckError(ArchiveError):
    """A file of the archive fails a check: a chunk missing, unreadable or truncated, its SHA-256,
    rows, transaction IDs, checksums or ``data_crc`` not what its manifest says, or chunks that are
    not contiguous.

    Attributes:
        file: the file, as the archive's location followed by its path in the archive.
        first: the first transaction of the range concerned (None: the file as a whole).
        last: the last transaction of that range (None: the file as a whole).
        problem: what is wrong, without the file and range that the message puts first.
    """

    def __init__(self, file: str, problem: str, first: int | None = None, last: int | None = None) -> None:
        where = file if first is None or last is None else f"{file} (transactions {first}..{last})"
        super().__init__(f"{where}: {problem}")
        self.problem = problem
        self.file = file
        self.first = first
        self.last = last


class ArchiveRefusedError(ArchiveError):
    """The archiver refuses to run: another location is on record in ZooKeeper, the archive belongs
    to another cluster, or ZooKeeper and the archive disagree in a way only an operator can settle."""


class ReplicaMismatchError(ArchiveError):
    """Replicas of a partition returned different records for a committed transaction (the message
    names the partition, the transaction and the replicas)."""
