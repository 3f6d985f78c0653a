"""Errors of the committed reads (all :class:`~waltz.errors.WaltzError`)."""

from __future__ import annotations

from waltz.errors import WaltzError

__all__ = ["CommittedReadError", "CorruptRecordError", "StorageDirectoryNotVisibleError"]


class CommittedReadError(WaltzError):
    """The log cannot be read as committed: no replica proves the requested records committed.

    The message names the partition, the transaction ID and what to give instead (more replica
    directories, an explicit high-water mark, or a reachable storage node).
    """


class CorruptRecordError(CommittedReadError):
    """A record read failed its CRC or does not have the expected transaction ID."""


class StorageDirectoryNotVisibleError(CommittedReadError):
    """An offline read's storage directory, found where the read was planned (the driver), is not
    there (or not readable) where a Spark task runs: the directories must be on a filesystem every
    executor sees at the same path. The message names the directory and the task's host."""
