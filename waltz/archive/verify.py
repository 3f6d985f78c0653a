"""``waltz archive verify``: every chunk against its manifest, the manifests against ZooKeeper.

Source: docs/design/archive.md "The archiver" (verify and ``--hold``). Each chunk is read with
every check of :func:`~waltz.archive.chunks.read_chunk` (the file's SHA-256 and size, its rows,
contiguous IDs, each record's data against its checksum, ``data_crc``); each manifest is checked
for contiguity; each partition's manifest against its entry in ``<root>/archive``. A problem is
named by its file and range. With ``hold``, a partition with a problem has its archived-through
lowered, in ZooKeeper and on its replicas, to the end of its last good chunk (the chunks from the
first one to the first problem), so that no storage node deletes what the archive cannot give back;
never above ZooKeeper's archived-through, and only on the archive ZooKeeper names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from waltz.archive.chunks import read_chunk
from waltz.archive.errors import (
    ArchiveCheckError,
    ArchiveError,
    ArchiveFormError,
    ArchiveFormTooNewError,
    ArchiveRefusedError,
)
from waltz.archive.layout import (
    ARCHIVE_MANIFEST,
    PARTITION_MANIFEST,
    ArchiveFiles,
    parse_chunk_name,
    partition_directory,
)
from waltz.archive.manifests import PartitionManifest, parse_partition_manifest, read_archive_manifest
from waltz.archive.replicas import replica_partition_statuses, statuses_by_partition, tell_replicas, was_told
from waltz.archive.summary import entry_of, record_partition
from waltz.metadata.values import ArchivedPartition, ArchiveSummary, ClusterParams
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig

__all__ = [
    "PROGRESS_EVERY",
    "PartitionCheck",
    "Problem",
    "VerifyReport",
    "check_holdable",
    "hold_archived_through",
    "verify_archive",
]

#: Seconds between verify's lines of how far it is within a partition (``progress_every``).
PROGRESS_EVERY = 5.0


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found, named by its file and range.

    Attributes:
        file: the file (the archive's location, then its path in the archive).
        first: the first transaction of the range concerned (None: the file as a whole).
        last: the last transaction of that range.
        message: what is wrong, with the file and range first.
    """

    file: str
    first: int | None
    last: int | None
    message: str

    @classmethod
    def at(cls, file: str, problem: str, first: int | None = None, last: int | None = None) -> Problem:
        """A problem of a file (and a range of it), its message as a check's."""
        return cls.of(ArchiveCheckError(file, problem, first, last), file)

    @classmethod
    def of(cls, error: ArchiveError, file: str) -> Problem:
        """The problem an error describes."""
        if isinstance(error, ArchiveCheckError):
            return cls(error.file, error.first, error.last, str(error))
        return cls(file, None, None, str(error))

    def to_json(self) -> dict[str, Any]:
        """The problem in ``--json`` output."""
        return {"file": self.file, "first": self.first, "last": self.last, "message": self.message}


@dataclass(slots=True)
class PartitionCheck:
    """What verify found of one partition.

    Attributes:
        partition_id: the partition.
        manifest_through: the archived-through its manifest states (-1: none).
        good: the chunks from the first up to the first problem, all verified.
        chunks_checked: chunks read and checked.
        records_checked: records in the chunks that passed.
        zookeeper: its entry in ``<root>/archive`` (None: no summary).
        problems: what is wrong, in the order found.
        notes: what is not wrong but worth saying (ZooKeeper behind the manifest, files no
            manifest lists).
        held_to: the archived-through ``--hold`` set and told the replicas: the lower of
            ``good_through`` and ZooKeeper's (None: not held).
        hold_untold: replicas (storage connect string -> why) ``--hold`` could not tell: they may
            still delete segments up to what they were told before.
        local_starts: ``--hold``: each answering replica's local start (storage connect string ->
            the first transaction on its disk), read after the hold.
    """

    partition_id: int
    manifest_through: int = -1
    good: PartitionManifest | None = None
    chunks_checked: int = 0
    records_checked: int = 0
    zookeeper: ArchivedPartition | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    held_to: int | None = None
    hold_untold: dict[str, str] = field(default_factory=dict)
    local_starts: dict[str, int] = field(default_factory=dict)

    @property
    def good_through(self) -> int:
        """The last transaction of the last good chunk (-1: none)."""
        return -1 if self.good is None else self.good.archived_through

    @property
    def lost_from_replicas(self) -> bool:
        """Whether retention deleted the first damaged transaction from every replica that answered
        (``--hold``): the next ``waltz archive run`` cannot write the damaged chunks again from
        them, only a copy of the archive can (docs/design/archive.md, "The archiver")."""
        return (
            bool(self.problems)
            and bool(self.local_starts)
            and min(self.local_starts.values()) > self.good_through + 1
        )

    def to_json(self) -> dict[str, Any]:
        """The partition in ``--json`` output."""
        return {
            "partition_id": self.partition_id,
            "passed": not self.problems,
            "manifest_archived_through": self.manifest_through,
            "good_through": self.good_through,
            "chunks_checked": self.chunks_checked,
            "records_checked": self.records_checked,
            "zookeeper_archived_through": None if self.zookeeper is None else self.zookeeper.archived_through,
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
            "held_to": self.held_to,
            "hold_untold": dict(self.hold_untold),
            "local_starts": dict(self.local_starts),
            "lost_from_replicas": self.lost_from_replicas,
        }


@dataclass(slots=True)
class VerifyReport:
    """What ``waltz archive verify`` found.

    Attributes:
        location: the archive.
        problems: problems of the archive as a whole (``archive.json``).
        notes: what is not wrong but worth saying (ZooKeeper names another location: a copy).
        partitions: one check per partition, in partition order.
    """

    location: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    partitions: list[PartitionCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no problem was found."""
        return not self.problems and not any(p.problems for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        """The report in ``--json`` output."""
        return {
            "location": self.location,
            "passed": self.passed,
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
            "partitions": [p.to_json() for p in self.partitions],
        }


def verify_archive(
    files: ArchiveFiles,
    summary: ArchiveSummary | None,
    num_partitions: int,
    partitions: Sequence[int] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    progress_every: float = PROGRESS_EVERY,
) -> VerifyReport:
    """Check every chunk of the archive against its manifest, and the manifests against ZooKeeper.

    Args:
        files: the archive.
        summary: ``<root>/archive`` (None: the cluster has none).
        num_partitions: the cluster's partition count.
        partitions: the partitions to check (None: all).
        progress: called with a line per partition checked, and, within a partition, with how far
            it is (``partition P: C of N chunks checked (through transaction T), R records so
            far``) after the first chunk checked once ``progress_every`` seconds have passed since
            the last line.
        progress_every: seconds between the lines within a partition (0: one per chunk).

    Returns:
        The report; nothing is changed.

    Raises:
        ArchiveFormError: ``archive.json`` is of a newer form than this waltz-py reads.
        LocationError: the location cannot be opened.
    """
    say = progress or (lambda _: None)
    report = VerifyReport(files.location)
    try:
        top = read_archive_manifest(files)
    except ArchiveFormTooNewError:
        raise
    except ArchiveFormError as exc:
        top = None
        report.problems.append(Problem.of(exc, files.name(ARCHIVE_MANIFEST)))
    else:
        if top is None:
            report.problems.append(Problem.at(files.name(ARCHIVE_MANIFEST), "missing"))
        elif top.num_partitions != num_partitions:
            report.problems.append(
                Problem.at(
                    files.name(ARCHIVE_MANIFEST),
                    f"{top.num_partitions} partitions, the cluster has {num_partitions}",
                )
            )
    if summary is not None and summary.location != files.location:
        report.notes.append(f"ZooKeeper names the archive {summary.location}; this is {files.location}")
    for pid in partitions if partitions is not None else range(num_partitions):
        check = _verify_partition(
            files,
            pid,
            None if summary is None else summary.of(pid),
            say if progress else None,
            progress_every,
        )
        report.partitions.append(check)
        state = "OK" if not check.problems else f"{len(check.problems)} problem(s)"
        say(f"partition {pid}: {check.chunks_checked} chunks, {check.records_checked} records: {state}")
    return report


def _verify_partition(
    files: ArchiveFiles,
    partition_id: int,
    recorded: ArchivedPartition | None,
    say: Callable[[str], None] | None = None,
    every: float = PROGRESS_EVERY,
) -> PartitionCheck:
    check = PartitionCheck(partition_id, zookeeper=recorded)
    relative = f"{partition_directory(partition_id)}/{PARTITION_MANIFEST}"
    try:
        raw = files.read_json(relative)
        if raw is None:
            manifest, problem = PartitionManifest(partition_id), None
        else:
            manifest, problem = parse_partition_manifest(raw, files.name(relative), partition_id)
            check.manifest_through = int(raw.get("archived_through", manifest.archived_through))
    except ArchiveError as exc:
        check.problems.append(Problem.of(exc, files.name(relative)))
        check.good = PartitionManifest(partition_id)
        return check
    if problem is not None:
        check.problems.append(Problem.of(problem, files.name(relative)))
    good = PartitionManifest(partition_id, (), manifest.form)
    intact = True
    last_said = time.monotonic()
    for entry in manifest.chunks:
        check.chunks_checked += 1
        try:
            records = read_chunk(files, partition_id, entry)
        except ArchiveCheckError as exc:
            check.problems.append(Problem.of(exc, files.name(relative)))
            intact = False
        else:
            check.records_checked += len(records)
            if intact:
                good = good.with_chunk(entry)
        if say is not None and time.monotonic() - last_said >= every:
            last_said = time.monotonic()
            say(
                f"partition {partition_id}: {check.chunks_checked} of {len(manifest.chunks)} chunks checked "
                f"(through transaction {entry.last}), {check.records_checked} records so far"
            )
    check.good = good
    listed = {c.file for c in manifest.chunks}
    unlisted = [
        n
        for n in files.files_in(partition_directory(partition_id))
        if parse_chunk_name(n) is not None and n not in listed
    ]
    if unlisted:
        check.notes.append(
            f"files no manifest lists (a run stopped before recording them; the next run adopts or "
            f"replaces the one that follows the manifest): {', '.join(unlisted)}"
        )
    _against_zookeeper(files, check, manifest, recorded, files.name(relative))
    return check


def _against_zookeeper(
    files: ArchiveFiles,
    check: PartitionCheck,
    manifest: PartitionManifest,
    recorded: ArchivedPartition | None,
    where: str,
) -> None:
    if recorded is None:
        return
    pid, through = check.partition_id, manifest.archived_through
    if recorded.archived_through > through:
        check.problems.append(
            Problem.at(
                where,
                f"ZooKeeper says partition {pid} is archived through {recorded.archived_through}, the "
                f"manifest through {through}",
                through + 1,
                recorded.archived_through,
            )
        )
    elif recorded.archived_through < through:
        check.notes.append(
            f"ZooKeeper says archived through {recorded.archived_through}, the manifest {through}: the next "
            "run raises ZooKeeper after checking the chunks above it"
        )
    elif (recorded.chunks, recorded.size_bytes) != (len(manifest.chunks), manifest.size_bytes):
        check.problems.append(
            Problem.at(
                where,
                f"ZooKeeper says partition {pid} has {recorded.chunks} chunks of {recorded.size_bytes} "
                f"bytes, the manifest {len(manifest.chunks)} of {manifest.size_bytes}",
            )
        )


def check_holdable(summary: ArchiveSummary | None, files: ArchiveFiles) -> None:
    """Refuse ``--hold`` of a location that is not the archive ZooKeeper names, such as a copy
    (docs/design/archive.md, "The archiver": the hold protects the archive the cluster archives to).

    Args:
        summary: ``<root>/archive`` (None: the cluster has none; then any location may be held,
            and the hold tells the replicas -1, nothing archived).
        files: the archive verified.

    Raises:
        ArchiveRefusedError: ZooKeeper names another location (the message names both).
    """
    if summary is not None and summary.location != files.location:
        raise ArchiveRefusedError(
            f"ZooKeeper names the archive {summary.location}, not {files.location}: --hold lowers what "
            "the replicas may delete to what the cluster's own archive holds, and a copy does not say "
            f"that; verify {files.location} without --hold, or hold {summary.location} (waltz archive "
            "verify --hold without --archive)"
        )


def hold_archived_through(
    cluster: ClusterZk,
    params: ClusterParams,
    files: ArchiveFiles,
    report: VerifyReport,
    *,
    operator: str = "",
    timeout: float = 10.0,
    tls: TlsConfig | None = None,
) -> None:
    """Lower the archived-through of every partition with a problem to its last good chunk, in
    ZooKeeper and on its replicas (``waltz archive verify --hold``; docs/design/archive.md, "The
    archiver").

    The hold only lowers: each partition is held at the lower of its last good chunk's end and
    ZooKeeper's archived-through (-1 where ZooKeeper has none), and its replicas are told that
    value. A manifest ahead of ZooKeeper (a crash between a manifest's write and ZooKeeper's
    raise) never raises what the replicas may delete. Sets each ``held_to`` to the value set, and
    ``hold_untold`` to the replicas that were not told (down, or a certificate without the admin
    role).

    Args:
        cluster: the cluster's znodes.
        params: the cluster's parameters (the admin open's key and partition count).
        files: the archive verified: the one ZooKeeper names.
        report: what :func:`verify_archive` found of it; its damaged partitions are held.
        operator: who asks, as told to the storage nodes.
        timeout: seconds for each storage node's admin call.
        tls: client TLS files for the admin ports.

    Raises:
        ArchiveRefusedError: ZooKeeper names another archive (hold the one it names), checked
            before anything is changed.
        StaleMetadataError: the summary kept changing.
    """
    current = cluster.archive_summary()
    check_holdable(None if current is None else current.value, files)
    for check in report.partitions:
        if not check.problems:
            continue
        good = check.good or PartitionManifest(check.partition_id)
        summary = cluster.archive_summary()
        recorded = -1 if summary is None else summary.value.of(check.partition_id).archived_through
        if recorded > good.archived_through:
            record_partition(cluster, files.location, check.partition_id, entry_of(good))
        held = min(recorded, good.archived_through)
        outcomes = tell_replicas(
            cluster,
            params,
            check.partition_id,
            held,
            files.location,
            operator=operator,
            timeout=timeout,
            tls=tls,
        )
        check.held_to = held
        check.hold_untold = {s: o for s, o in sorted(outcomes.items()) if not was_told(o)}
    _read_local_starts(cluster, params, report, timeout=timeout, tls=tls)


def _read_local_starts(
    cluster: ClusterZk, params: ClusterParams, report: VerifyReport, *, timeout: float, tls: TlsConfig | None
) -> None:
    """Set each damaged partition's ``local_starts`` from its replicas' partition status (one
    admin call per node); a node that does not answer is left out."""
    damaged = {c.partition_id: c for c in report.partitions if c.problems}
    if not damaged:
        return
    replicas = cluster.assignments().value
    statuses = statuses_by_partition(replica_partition_statuses(cluster, params, timeout=timeout, tls=tls))
    for pid, check in damaged.items():
        assigned = replicas.storages_of(pid)
        check.local_starts = {s: e.local_start for s, e in statuses.get(pid, {}).items() if s in assigned}
