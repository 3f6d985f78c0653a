"""``waltz archive status``: per partition, what the archive holds, what each replica holds on its
disk, and how far the archive lags behind the committed log.

Source: docs/design/archive.md "Terms" (local start, archived-through), "The archiver". The
archive's side comes from the partition's manifest and from ``<root>/archive``; each replica's
local range from its partition status over the admin port (``local_start``, which a node that does
not report it yet leaves at 0, and ``max_transaction_id``); the committed high-water mark from a
live plan (:func:`~waltz.committed.plan.plan_live_on`). Nothing is changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from waltz.admin.description import opened_partitions
from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT
from waltz.archive.errors import ArchiveError
from waltz.archive.layout import ArchiveFiles
from waltz.archive.manifests import read_partition_manifest
from waltz.archive.replicas import replica_partition_statuses, statuses_by_partition
from waltz.committed.errors import CommittedReadError
from waltz.committed.plan import plan_live_on
from waltz.metadata.values import ArchivedPartition
from waltz.metadata.zk import ClusterZk
from waltz.protocol import storage_pb2
from waltz.protocol.channels import TlsConfig

__all__ = ["ArchiveStatus", "PartitionArchiveStatus", "ReplicaRange", "archive_status"]


@dataclass(frozen=True, slots=True)
class ReplicaRange:
    """What one replica of a partition holds on its disk.

    Attributes:
        storage: the storage node's connect string.
        local_start: the first transaction ID on its disk (0 from a node that does not report it).
        max_transaction_id: the last one (-1: none).
        archived_through: what the archiver last told it (-1: nothing, or a node that does not
            report it).
        error: why the node did not answer, or None.
    """

    storage: str
    local_start: int | None = None
    max_transaction_id: int | None = None
    archived_through: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The replica in ``--json`` output."""
        return {
            "storage": self.storage,
            "local_start": self.local_start,
            "max_transaction_id": self.max_transaction_id,
            "archived_through": self.archived_through,
            "error": self.error,
        }


@dataclass(slots=True)
class PartitionArchiveStatus:
    """One partition's line of ``waltz archive status``.

    Attributes:
        partition_id: the partition.
        first: the first archived transaction (None: nothing archived).
        archived_through: the manifest's archived-through (-1: nothing).
        chunks: the manifest's chunks.
        size_bytes: their bytes.
        manifest_error: why the manifest could not be read, or None.
        zookeeper: the partition's entry in ``<root>/archive``.
        high_water_mark: the committed high-water mark (None: no replica proved it).
        replicas: each replica's local range.
    """

    partition_id: int
    first: int | None = None
    archived_through: int = -1
    chunks: int = 0
    size_bytes: int = 0
    manifest_error: str | None = None
    zookeeper: ArchivedPartition = field(default_factory=ArchivedPartition)
    high_water_mark: int | None = None
    replicas: list[ReplicaRange] = field(default_factory=list)

    @property
    def lag(self) -> int | None:
        """Committed transactions not yet archived: the high-water mark minus ZooKeeper's
        archived-through, never below 0 (a restored cluster's partition before its first store
        session proves no mark above -1); None: the high-water mark is not known."""
        if self.high_water_mark is None:
            return None
        return max(0, self.high_water_mark - self.zookeeper.archived_through)

    @property
    def replicas_not_told(self) -> list[str]:
        """The replicas that answered with an archived-through other than ZooKeeper's: not told
        (they keep segments the archive holds) or told more than it holds; the next
        ``waltz archive run`` tells them."""
        return [
            r.storage
            for r in self.replicas
            if r.error is None and r.archived_through != self.zookeeper.archived_through
        ]

    def to_json(self) -> dict[str, Any]:
        """The partition in ``--json`` output."""
        return {
            "partition_id": self.partition_id,
            "archive": {
                "first": self.first,
                "archived_through": self.archived_through,
                "chunks": self.chunks,
                "bytes": self.size_bytes,
                "error": self.manifest_error,
            },
            "zookeeper": {
                "archived_through": self.zookeeper.archived_through,
                "chunks": self.zookeeper.chunks,
                "bytes": self.zookeeper.size_bytes,
            },
            "high_water_mark": self.high_water_mark,
            "lag": self.lag,
            "replicas": [r.to_json() for r in self.replicas],
            "replicas_not_told": self.replicas_not_told,
        }


@dataclass(slots=True)
class ArchiveStatus:
    """``waltz archive status``.

    Attributes:
        location: the archive (None: the cluster has none yet).
        partitions: one line per partition of the count at creation, in partition order.
    """

    location: str | None
    partitions: list[PartitionArchiveStatus] = field(default_factory=list)
    not_archived: list[int] = field(default_factory=list)
    """Partitions a split opened, which the archive does not follow yet (their records stay on
    the storage nodes: retention deletes archived segments only)."""
    unanswered: dict[str, str] = field(default_factory=dict)
    """Storage nodes that did not answer their status request (storage connect string -> why):
    what they hold is unknown."""

    def to_json(self) -> dict[str, Any]:
        """The status in ``--json`` output."""
        return {
            "location": self.location,
            "partitions": [p.to_json() for p in self.partitions],
            "not_archived": self.not_archived,
            "unanswered": dict(self.unanswered),
        }


def archive_status(
    cluster: ClusterZk,
    files: ArchiveFiles | None,
    partitions: Sequence[int] | None = None,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> ArchiveStatus:
    """Each partition's archived range, its replicas' local ranges and the archive's lag.

    Args:
        cluster: the cluster's znodes.
        files: the archive (None: the cluster has none; only the replicas and marks are shown).
        partitions: the partitions (None: all).
        timeout: seconds for each storage node.
        tls: client TLS files for the admin ports.

    Raises:
        ClusterNotFoundError, ZooKeeperUnavailableError: the cluster or ZooKeeper is not there.
    """
    params = cluster.params()
    summary = cluster.archive_summary()
    ids = list(partitions) if partitions is not None else list(range(params.num_partitions))
    statuses = replica_partition_statuses(cluster, params, timeout=timeout, tls=tls)
    assignments = cluster.assignments().value
    report = ArchiveStatus(None if files is None else files.location)
    report.unanswered = {s: answer for s, answer in sorted(statuses.items()) if isinstance(answer, str)}
    held = statuses_by_partition(statuses)
    report.not_archived = list(opened_partitions(cluster, params))
    for pid in ids:
        line = PartitionArchiveStatus(pid)
        if summary is not None:
            line.zookeeper = summary.value.of(pid)
        if files is not None:
            try:
                manifest = read_partition_manifest(files, pid)
            except (ArchiveError, OSError) as exc:
                line.manifest_error = str(exc)
            else:
                line.first, line.archived_through = manifest.start, manifest.archived_through
                line.chunks, line.size_bytes = len(manifest.chunks), manifest.size_bytes
        entries = held.get(pid, {})
        for storage in assignments.storages_of(pid):
            line.replicas.append(_replica_range(storage, statuses.get(storage), entries.get(storage)))
        if any(r.error is None for r in line.replicas):
            try:
                (plan,) = plan_live_on(cluster, [pid], timeout=timeout, tls=tls)
                line.high_water_mark = plan.high_water_mark
            except CommittedReadError:
                line.high_water_mark = None
        # else: no replica answered its status, and none would answer the plan's reads (each
        # would wait out the timeout again): the high-water mark stays unknown.
        report.partitions.append(line)
    return report


def _replica_range(
    storage: str,
    answer: storage_pb2.PartitionStatusResponse | str | None,
    entry: storage_pb2.PartitionStatus | None,
) -> ReplicaRange:
    if answer is None:
        return ReplicaRange(storage, error="no admin port on record")
    if isinstance(answer, str):
        return ReplicaRange(storage, error=answer)
    if entry is None:
        return ReplicaRange(storage, error="the node does not hold the partition")
    return ReplicaRange(storage, entry.local_start, entry.max_transaction_id, entry.archived_through)
