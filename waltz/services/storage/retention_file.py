"""A partition's ``retention.json``: the archived-through the archiver last gave the storage node.

Design: docs/design/archive.md, "Retention on the storage nodes"; the form is in docs/format.md,
"Retention file `retention.json`". The storage nodes never read ZooKeeper, so the archiver tells
each replica what is archived (an admin request), and the node keeps it here, beside the
segments. The file is replaced whole: written to a temporary file, flushed, renamed over the old
one, and the directory flushed. A missing file means nothing is archived (-1). A damaged one is
never guessed at: :func:`load_archived_through` logs an error and takes -1, so that retention
deletes nothing until the archiver sets the value again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from waltz.errors import CorruptDataError
from waltz.private_files import open_private
from waltz.services.storage.fsutil import fsync_directory

__all__ = [
    "RETENTION_FILE",
    "RETENTION_FORM",
    "RETENTION_KIND",
    "RetentionRecord",
    "load_archived_through",
    "read_retention_file",
    "write_retention_file",
]

log = logging.getLogger(__name__)

#: The file's name in the partition directory.
RETENTION_FILE = "retention.json"
#: The form this code writes and reads; a newer form is refused as damaged.
RETENTION_FORM = 1
#: The value of the file's ``kind`` field.
RETENTION_KIND = "waltz-storage-retention"
#: A file larger than this is not a retention file (it is refused unread).
_MAX_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class RetentionRecord:
    """The content of a partition's ``retention.json`` (form 1, docs/format.md).

    Attributes:
        partition_id: the partition (it must match the directory the file lies in).
        archived_through: every transaction up to it is in the archive, verified (-1: none).
        archive: the archive's location, as the archiver named it (for logs and status).
        operator: who set it, as the tool stated it.
        updated_at: when the node wrote it (UTC, ISO 8601).
    """

    partition_id: int
    archived_through: int
    archive: str = ""
    operator: str = ""
    updated_at: str = ""

    def to_json(self) -> dict[str, object]:
        """The file's JSON object."""
        return {
            "form": RETENTION_FORM,
            "kind": RETENTION_KIND,
            "partition_id": self.partition_id,
            "archived_through": self.archived_through,
            "archive": self.archive,
            "operator": self.operator,
            "updated_at": self.updated_at,
        }


def _damaged(path: Path, partition_id: int, why: str) -> CorruptDataError:
    return CorruptDataError(f"retention file is damaged: {why}", path=str(path), partition_id=partition_id)


def _integer(document: dict[str, object], name: str, path: Path, partition_id: int) -> int:
    value = document.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _damaged(path, partition_id, f"{name} is {value!r}, not an integer")
    return value


def _text(document: dict[str, object], name: str, path: Path, partition_id: int) -> str:
    value = document.get(name, "")
    if not isinstance(value, str):
        raise _damaged(path, partition_id, f"{name} is {value!r}, not a string")
    return value


def read_retention_file(directory: Path, partition_id: int) -> RetentionRecord | None:
    """Read a partition directory's ``retention.json``.

    Args:
        directory: the partition directory.
        partition_id: the partition it holds.

    Returns:
        Its record, or None when the directory holds no retention file.

    Raises:
        CorruptDataError: the file does not decode, is of another form or kind, names another
            partition, or holds an archived-through below -1.
        OSError: the file exists but cannot be read.
    """
    path = directory / RETENTION_FILE
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > _MAX_BYTES:
        raise _damaged(path, partition_id, f"larger than {_MAX_BYTES} bytes")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON, nested too deep, too many digits
        raise _damaged(path, partition_id, f"not JSON that this node reads ({exc})") from None
    if not isinstance(document, dict):
        raise _damaged(path, partition_id, "not a JSON object")
    form = _integer(document, "form", path, partition_id)
    if form != RETENTION_FORM:
        raise _damaged(path, partition_id, f"form {form}; this storage node reads form {RETENTION_FORM}")
    if document.get("kind") != RETENTION_KIND:
        raise _damaged(path, partition_id, f"kind is {document.get('kind')!r}, not {RETENTION_KIND!r}")
    stored = _integer(document, "partition_id", path, partition_id)
    if stored != partition_id:
        raise _damaged(
            path, partition_id, f"it is partition {stored}'s, in partition {partition_id}'s directory"
        )
    archived_through = _integer(document, "archived_through", path, partition_id)
    if archived_through < -1:
        raise _damaged(path, partition_id, f"archived_through is {archived_through} (at least -1)")
    return RetentionRecord(
        partition_id,
        archived_through,
        _text(document, "archive", path, partition_id),
        _text(document, "operator", path, partition_id),
        _text(document, "updated_at", path, partition_id),
    )


def load_archived_through(directory: Path, partition_id: int) -> int:
    """A partition's archived-through as the node takes it at start-up: -1 without a file, and -1
    with an error logged when the file is damaged or unreadable (never a guess that deletes)."""
    try:
        record = read_retention_file(directory, partition_id)
    except (CorruptDataError, OSError) as exc:
        log.error(
            "partition %d: %s; taking archived-through as -1: retention deletes nothing until the "
            "archiver sets it again",
            partition_id,
            exc,
        )
        return -1
    return -1 if record is None else record.archived_through


def write_retention_file(directory: Path, record: RetentionRecord) -> RetentionRecord:
    """Replace a partition directory's ``retention.json`` durably.

    Written to ``retention.json.tmp``, flushed, renamed over the file, then the directory flushed.

    Args:
        directory: the partition directory.
        record: what to keep; its ``updated_at`` is set to now.

    Returns:
        The record written.

    Raises:
        OSError: the file could not be written (the previous one, if any, stays).
    """
    written = RetentionRecord(
        record.partition_id,
        record.archived_through,
        record.archive,
        record.operator,
        datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )
    path = directory / RETENTION_FILE
    temporary = path.with_name(RETENTION_FILE + ".tmp")
    data = (json.dumps(written.to_json(), indent=2) + "\n").encode("utf-8")
    try:
        with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(directory)
    return written
