"""Errors of the Spark reader and the rebuild job (all :class:`~waltz.errors.WaltzError`)."""

from __future__ import annotations

from waltz.errors import WaltzError

__all__ = ["CommittedReadError", "CorruptRecordError", "RebuildError", "SparkUnavailableError"]


class CommittedReadError(WaltzError):
    """The log cannot be read as committed: no replica proves the requested records committed.

    The message names the partition, the transaction ID and what to give instead (more replica
    directories, an explicit high-water mark, or a reachable storage node).
    """


class CorruptRecordError(CommittedReadError):
    """A record read failed its CRC or does not have the expected transaction ID."""


class RebuildError(WaltzError):
    """The rebuild job could not compute or write the views (the old tables are left as they were)."""


class SparkUnavailableError(WaltzError, ImportError):
    """PySpark (or pyarrow) is not importable: install the ``spark`` extra (``pip install -e '.[spark]'``)."""
