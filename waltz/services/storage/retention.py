"""Retention on a storage node: which sealed segments a partition may delete once archived.

Design: docs/design/archive.md, "Retention on the storage nodes". The node keeps, per partition,
the archived-through the archiver last gave it (:mod:`~waltz.services.storage.retention_file`);
with the policy ``archived`` a check on the partition's I/O thread deletes its oldest sealed
segments whose every transaction is at or below it and that are past every keep setting
(:meth:`StoragePartition.apply_retention
<waltz.services.storage.storage_partition.StoragePartition.apply_retention>`, which asks
:func:`segments_to_delete`). This module decides; it touches no file.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CHECK_INTERVAL",
    "DEFAULT_KEEP_SECONDS",
    "DeletedSegment",
    "RetentionPolicy",
    "RetentionSettings",
    "SegmentSpan",
    "segments_to_delete",
]

#: Seconds a sealed segment is kept at least, archived or not (``storage.retention.keepSeconds``).
DEFAULT_KEEP_SECONDS = 86_400.0
#: Seconds between two retention checks of a partition (``storage.retention.checkInterval``).
DEFAULT_CHECK_INTERVAL = 300.0


class RetentionPolicy(enum.Enum):
    """What a storage node deletes (``storage.retention.policy``)."""

    NEVER = "never"
    """Nothing: every segment stays (the default)."""
    ARCHIVED = "archived"
    """Sealed segments wholly at or below the partition's archived-through, past the keep settings."""


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """A storage node's retention settings (docs/design/archive.md, "Retention on the storage nodes").

    Attributes:
        policy: what may be deleted.
        keep_seconds: seconds since a segment was sealed before it may go.
        keep_segments: newer segments that must remain after a deleted one.
        keep_bytes: bytes of newer segments' data files that must remain after a deleted one.
        check_interval: seconds between two checks of a partition.

    Raises:
        ValueError: a keep setting is negative (or not finite), or ``check_interval`` is not positive.
    """

    policy: RetentionPolicy = RetentionPolicy.NEVER
    keep_seconds: float = DEFAULT_KEEP_SECONDS
    keep_segments: int = 0
    keep_bytes: int = 0
    check_interval: float = DEFAULT_CHECK_INTERVAL

    def __post_init__(self) -> None:
        if not (math.isfinite(self.keep_seconds) and self.keep_seconds >= 0):
            raise ValueError(f"keep_seconds must be 0 or more, not {self.keep_seconds}")
        if self.keep_segments < 0 or self.keep_bytes < 0:
            raise ValueError(
                f"keep_segments and keep_bytes must be 0 or more, not {self.keep_segments} and "
                f"{self.keep_bytes}"
            )
        if not (math.isfinite(self.check_interval) and self.check_interval > 0):
            raise ValueError(f"check_interval must be positive, not {self.check_interval}")


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """What a retention decision needs of one segment of a partition.

    Attributes:
        first_transaction_id: its first transaction.
        max_transaction_id: its last transaction (``first - 1`` when it holds none).
        size: its data file's size in bytes.
        sealed_at: when it was sealed, in seconds since the epoch (the creation time in the next
            segment's header); None for the partition's last segment, which is never sealed.
    """

    first_transaction_id: int
    max_transaction_id: int
    size: int
    sealed_at: float | None


@dataclass(frozen=True, slots=True)
class DeletedSegment:
    """A segment retention deleted (for its log line and its metrics).

    Attributes:
        partition_id: the partition.
        file_name: its data file's name.
        first_transaction_id: its first transaction.
        max_transaction_id: its last transaction.
        size: its data file's size in bytes.
    """

    partition_id: int
    file_name: str
    first_transaction_id: int
    max_transaction_id: int
    size: int


def segments_to_delete(
    segments: Sequence[SegmentSpan], archived_through: int, settings: RetentionSettings, now: float
) -> int:
    """How many of a partition's oldest segments retention deletes now.

    Segments go oldest first, and a segment goes only when all of these hold: the policy is
    ``archived``; it is sealed (never the last segment); every transaction of it is at or below
    ``archived_through``; it was sealed at least ``keep_seconds`` before ``now``; at least
    ``keep_segments`` newer segments and ``keep_bytes`` bytes of newer segments remain. The
    first segment that must stay keeps every newer one too.

    Args:
        segments: the partition's segments, oldest first.
        archived_through: the highest transaction such that every one up to it is archived (-1: none).
        settings: the node's retention settings.
        now: the time, in seconds since the epoch.

    Returns:
        The number of segments to delete from the oldest, between 0 and ``len(segments) - 1``.
    """
    if settings.policy is not RetentionPolicy.ARCHIVED:
        return 0
    newer_bytes = sum(segment.size for segment in segments)
    count = 0
    for index, segment in enumerate(segments[:-1]):
        newer_bytes -= segment.size
        newer = len(segments) - 1 - index
        if (
            segment.sealed_at is None
            or segment.max_transaction_id > archived_through
            or now - segment.sealed_at < settings.keep_seconds
            or newer < settings.keep_segments
            or newer_bytes < settings.keep_bytes
        ):
            break
        count += 1
    return count
