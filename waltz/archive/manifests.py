"""The archive's manifests: ``archive.json`` and each partition's ``manifest.json`` (form 1).

Source: docs/design/archive.md "The archive's layout and forms". A manifest is read with every
check of its form: its ``kind``, a ``form`` this code reads (a newer one is refused: upgrade
waltz-py), every field present and of its type, each chunk's file named after its range, and the
chunks contiguous and non-overlapping. A manifest is changed only by returning a new value
(:meth:`PartitionManifest.with_chunk`), written to a temporary file and renamed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from waltz.archive.errors import ArchiveCheckError, ArchiveFormError, ArchiveFormTooNewError
from waltz.archive.layout import (
    ARCHIVE_MANIFEST,
    PARTITION_MANIFEST,
    ArchiveFiles,
    chunk_name,
    partition_directory,
)
from waltz.archive.location import check_form, int_field, str_field
from waltz.protocol.cluster_key import cluster_key_fingerprint

__all__ = [
    "ARCHIVE_FORM",
    "ARCHIVE_KIND",
    "PARTITION_KIND",
    "ArchiveManifest",
    "ChunkEntry",
    "PartitionManifest",
    "cluster_key_fingerprint",
    "parse_partition_manifest",
    "read_archive_manifest",
    "read_partition_manifest",
    "write_archive_manifest",
    "write_partition_manifest",
]

#: The form of ``archive.json`` and of a partition's ``manifest.json``; a reader refuses a newer one.
ARCHIVE_FORM = 1
#: What ``"kind"`` says in ``archive.json``.
ARCHIVE_KIND = "waltz-archive"
#: What ``"kind"`` says in a partition's ``manifest.json``.
PARTITION_KIND = "waltz-archive-partition"


def _check_form(raw: Any, kind: str, where: str) -> dict[str, Any]:
    return check_form(
        raw,
        kind=kind,
        newest=ARCHIVE_FORM,
        noun="archive",
        where=where,
        error=ArchiveFormError,
        too_new=ArchiveFormTooNewError,
    )


def _int(raw: Mapping[str, Any], key: str, where: str) -> int:
    return int_field(raw, key, where, ArchiveFormError)


def _str(raw: Mapping[str, Any], key: str, where: str) -> str:
    return str_field(raw, key, where, ArchiveFormError)


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ArchiveFormError(f"{where}: field {key!r} is {value!r}, expected a list of strings")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class ArchiveManifest:
    """``archive.json``: what the archive is and which clusters wrote to it.

    Attributes:
        num_partitions: the cluster's partition count.
        cluster_key_fingerprints: :func:`cluster_key_fingerprint` of each cluster that wrote to
            it (a restored cluster adds its own).
        created_at: when the archive was started (UTC, ISO 8601).
        form: the form (:data:`ARCHIVE_FORM`).
    """

    num_partitions: int
    cluster_key_fingerprints: tuple[str, ...]
    created_at: str
    form: int = ARCHIVE_FORM

    def to_json(self) -> dict[str, Any]:
        """The JSON document."""
        return {
            "form": self.form,
            "kind": ARCHIVE_KIND,
            "num_partitions": self.num_partitions,
            "cluster_key_fingerprints": list(self.cluster_key_fingerprints),
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, raw: Any, where: str) -> ArchiveManifest:
        """Parse ``archive.json``.

        Raises:
            ArchiveFormError: not of its kind, a newer form, or a field missing or malformed.
        """
        raw = _check_form(raw, ARCHIVE_KIND, where)
        num_partitions = _int(raw, "num_partitions", where)
        if num_partitions < 1:
            raise ArchiveFormError(f"{where}: num_partitions is {num_partitions}, expected at least 1")
        return cls(
            num_partitions,
            _strings(raw, "cluster_key_fingerprints", where),
            _str(raw, "created_at", where),
            raw["form"],
        )


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    """One chunk of a partition's manifest.

    Attributes:
        first: its first transaction ID.
        last: its last transaction ID.
        file: its file name, in the partition's directory (:func:`~waltz.archive.layout.chunk_name`).
        rows: its row count, ``last - first + 1``.
        size_bytes: the file's size (``bytes`` in the manifest).
        sha256: the SHA-256 of the file, hex.
        data_crc: the CRC-32 over the records' checksums in order
            (:func:`~waltz.archive.columns.data_crc`).
        verified_replicas: the storage nodes (connect strings) whose records it was checked against.
        archived_at: when it was added (UTC, ISO 8601).
    """

    first: int
    last: int
    file: str
    rows: int
    size_bytes: int
    sha256: str
    data_crc: int
    verified_replicas: tuple[str, ...]
    archived_at: str

    def to_json(self) -> dict[str, Any]:
        """The chunk's entry in the manifest."""
        return {
            "first": self.first,
            "last": self.last,
            "file": self.file,
            "rows": self.rows,
            "bytes": self.size_bytes,
            "sha256": self.sha256,
            "data_crc": self.data_crc,
            "verified_replicas": list(self.verified_replicas),
            "archived_at": self.archived_at,
        }

    @classmethod
    def from_json(cls, raw: Any, where: str) -> ChunkEntry:
        """Parse a chunk's entry.

        Raises:
            ArchiveFormError: a field missing or malformed, or a file name or row count that does
                not match the range.
        """
        if not isinstance(raw, dict):
            raise ArchiveFormError(f"{where}: a chunk entry is {raw!r}, expected an object")
        entry = cls(
            _int(raw, "first", where),
            _int(raw, "last", where),
            _str(raw, "file", where),
            _int(raw, "rows", where),
            _int(raw, "bytes", where),
            _str(raw, "sha256", where),
            _int(raw, "data_crc", where),
            _strings(raw, "verified_replicas", where),
            _str(raw, "archived_at", where),
        )
        if entry.first < 0 or entry.last < entry.first:
            raise ArchiveFormError(f"{where}: a chunk holds transactions {entry.first}..{entry.last}")
        if entry.file != chunk_name(entry.first, entry.last):
            raise ArchiveFormError(
                f"{where}: the chunk of transactions {entry.first}..{entry.last} names the file "
                f"{entry.file!r}, not {chunk_name(entry.first, entry.last)!r}"
            )
        if entry.rows != entry.last - entry.first + 1:
            raise ArchiveFormError(
                f"{where}: the chunk {entry.file} (transactions {entry.first}..{entry.last}) says it "
                f"has {entry.rows} rows, not {entry.last - entry.first + 1}"
            )
        return entry


@dataclass(frozen=True, slots=True)
class PartitionManifest:
    """A partition's ``manifest.json``: its chunks, contiguous, in order.

    Attributes:
        partition_id: the partition.
        chunks: its chunks; each starts where the one before ended.
        form: the form (:data:`ARCHIVE_FORM`).
    """

    partition_id: int
    chunks: tuple[ChunkEntry, ...] = ()
    form: int = ARCHIVE_FORM

    @property
    def archived_through(self) -> int:
        """The last transaction of the last chunk (-1: none)."""
        return self.chunks[-1].last if self.chunks else -1

    @property
    def start(self) -> int | None:
        """The first archived transaction (None: no chunk)."""
        return self.chunks[0].first if self.chunks else None

    @property
    def size_bytes(self) -> int:
        """The chunks' bytes in all."""
        return sum(c.size_bytes for c in self.chunks)

    def next_first(self, log_start: int = 0) -> int:
        """The first transaction of the next chunk: after the last one, or ``log_start`` when none."""
        return self.archived_through + 1 if self.chunks else log_start

    def with_chunk(self, entry: ChunkEntry) -> PartitionManifest:
        """This manifest with a chunk added at its end.

        Raises:
            ArchiveCheckError: the chunk does not start right after the last one.
        """
        if self.chunks and entry.first != self.archived_through + 1:
            raise ArchiveCheckError(
                entry.file,
                f"partition {self.partition_id}: a chunk must start at {self.archived_through + 1}",
                entry.first,
                entry.last,
            )
        return replace(self, chunks=(*self.chunks, entry))

    def with_chunk_replaced(self, entry: ChunkEntry) -> PartitionManifest:
        """This manifest with the chunk of the same range replaced by ``entry``.

        Raises:
            ArchiveCheckError: no chunk holds exactly that range.
        """
        index = next(
            (i for i, c in enumerate(self.chunks) if (c.first, c.last) == (entry.first, entry.last)), None
        )
        if index is None:
            raise ArchiveCheckError(
                entry.file, f"partition {self.partition_id}: no chunk of that range", entry.first, entry.last
            )
        return replace(self, chunks=(*self.chunks[:index], entry, *self.chunks[index + 1 :]))

    def to_json(self) -> dict[str, Any]:
        """The JSON document."""
        return {
            "form": self.form,
            "kind": PARTITION_KIND,
            "partition_id": self.partition_id,
            "archived_through": self.archived_through,
            "chunks": [c.to_json() for c in self.chunks],
        }

    @classmethod
    def from_json(cls, raw: Any, where: str, partition_id: int) -> PartitionManifest:
        """Parse and check a partition's manifest.

        Args:
            raw: the parsed JSON.
            where: the file, for messages.
            partition_id: the partition whose directory holds it.

        Raises:
            ArchiveFormError: not of its kind, a newer form, another partition, a field missing
                or malformed.
            ArchiveCheckError: chunks that overlap, leave a gap, or an ``archived_through`` that
                is not the last chunk's last transaction.
        """
        manifest, problem = parse_partition_manifest(raw, where, partition_id)
        if problem is not None:
            raise problem
        return manifest


def parse_partition_manifest(
    raw: Any, where: str, partition_id: int
) -> tuple[PartitionManifest, ArchiveCheckError | None]:
    """A partition's manifest up to its first problem of contiguity, and that problem.

    :meth:`PartitionManifest.from_json` refuses a manifest with a problem; ``waltz archive verify``
    checks the chunks before it, and holds the archived-through at the last good one.

    Returns:
        The manifest of the contiguous chunks from the first, and the first problem after them
        (None: the whole manifest is good).

    Raises:
        ArchiveFormError: not of its kind, a newer form, another partition, a field missing or
            malformed.
    """
    raw = _check_form(raw, PARTITION_KIND, where)
    if _int(raw, "partition_id", where) != partition_id:
        raise ArchiveFormError(
            f"{where}: the manifest is of partition {raw['partition_id']}, in the directory of "
            f"partition {partition_id}"
        )
    listed = raw.get("chunks")
    if not isinstance(listed, list):
        raise ArchiveFormError(f"{where}: field 'chunks' is {listed!r}, expected a list")
    chunks = tuple(ChunkEntry.from_json(c, where) for c in listed)
    stated = _int(raw, "archived_through", where)
    for index, (before, after) in enumerate(itertools.pairwise(chunks), start=1):
        if after.first != before.last + 1:
            problem = "overlaps the chunk before" if after.first <= before.last else "leaves a gap"
            return PartitionManifest(partition_id, chunks[:index], raw["form"]), ArchiveCheckError(
                where,
                f"the chunk {after.file} {problem} ({before.file} ends at {before.last}): chunks must be "
                "contiguous",
                after.first,
                after.last,
            )
    manifest = PartitionManifest(partition_id, chunks, raw["form"])
    if stated != manifest.archived_through:
        return manifest, ArchiveCheckError(
            where, f"archived_through is {stated}, but the last chunk ends at {manifest.archived_through}"
        )
    return manifest, None


def read_archive_manifest(files: ArchiveFiles) -> ArchiveManifest | None:
    """The archive's ``archive.json``, or None when the location holds none.

    Raises:
        ArchiveFormError: it is not a manifest this code reads.
        OSError: it is unreadable.
    """
    raw = files.read_json(ARCHIVE_MANIFEST)
    return None if raw is None else ArchiveManifest.from_json(raw, files.name(ARCHIVE_MANIFEST))


def write_archive_manifest(files: ArchiveFiles, manifest: ArchiveManifest) -> None:
    """Write ``archive.json`` (a temporary file, then a rename).

    Raises:
        ArchiveUnwritableError: the location refused the write.
    """
    files.write_json(ARCHIVE_MANIFEST, manifest.to_json())


def _manifest_path(partition_id: int) -> str:
    return f"{partition_directory(partition_id)}/{PARTITION_MANIFEST}"


def read_partition_manifest(files: ArchiveFiles, partition_id: int) -> PartitionManifest:
    """A partition's manifest; an empty one when the partition has none yet.

    Raises:
        ArchiveFormError, ArchiveCheckError: as :meth:`PartitionManifest.from_json`.
        OSError: it is unreadable.
    """
    relative = _manifest_path(partition_id)
    raw = files.read_json(relative)
    if raw is None:
        return PartitionManifest(partition_id)
    return PartitionManifest.from_json(raw, files.name(relative), partition_id)


def write_partition_manifest(files: ArchiveFiles, manifest: PartitionManifest) -> None:
    """Write a partition's manifest (a temporary file, then a rename).

    Raises:
        ArchiveUnwritableError: the location refused the write.
    """
    files.write_json(_manifest_path(manifest.partition_id), manifest.to_json())
