"""The cluster's znodes in ZooKeeper, read and written with compare-and-set (kazoo).

Layout under the cluster root (``docs/zookeeper.md``)::

    <root>/cluster                  ClusterParams (name, number of partitions, cluster key)
    <root>/store/assignment         ReplicaAssignments (storage connect string -> partitions)
    <root>/store/group              GroupDescriptor (storage connect string -> group)
    <root>/store/connection         ConnectionMetadata (storage connect string -> admin port)
    <root>/store/partition/<id>     PartitionMetadata (generation, session ID, replica states)
    <root>/server/...               server membership and partition assignment (cluster manager)
    <root>/archive                  ArchiveSummary (the archive's location, per partition what it holds)

Every znode is created with the session's default ACL: with a digest credential, all rights to
that credential alone (docs/design/zookeeper.md, "Security"); a refused access raises
:class:`~waltz.metadata.zk_session.ZooKeeperAuthError`.

Nothing here is on the append path: znodes change only on faults and assignment changes.
The methods block (kazoo's synchronous API); async callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

from waltz.errors import ClusterNotFoundError, GenerationFencedError, MetadataError, StaleMetadataError
from waltz.metadata.values import (
    ArchiveSummary,
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    PartitionMetadata,
    ReplicaAssignments,
)
from waltz.metadata.zk_session import zookeeper_access

__all__ = ["ClusterPaths", "ClusterZk", "Versioned"]

log = logging.getLogger(__name__)

#: Attempts of a compare-and-set loop before giving up (each attempt re-reads the znode).
MAX_CAS_ATTEMPTS = 50


class _Codec(Protocol):
    def encode(self) -> bytes: ...


V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Versioned(Generic[V]):
    """A znode's decoded value and its version (for compare-and-set)."""

    value: V
    version: int


@dataclass(frozen=True, slots=True)
class ClusterPaths:
    """The znode paths of one cluster."""

    root: str

    @classmethod
    def of(cls, root: str) -> Self:
        """Normalise a cluster root (absolute, no trailing slash).

        Raises:
            MetadataError: the root is not an absolute path, or is ``/``.
        """
        normalised = "/" + root.strip("/")
        if not root.startswith("/") or normalised == "/":
            raise MetadataError(
                f"cluster root {root!r} must be an absolute znode path such as /waltz/cluster1"
            )
        return cls(normalised)

    @property
    def cluster(self) -> str:
        return f"{self.root}/cluster"

    @property
    def store(self) -> str:
        return f"{self.root}/store"

    @property
    def assignment(self) -> str:
        return f"{self.root}/store/assignment"

    @property
    def group(self) -> str:
        return f"{self.root}/store/group"

    @property
    def connection(self) -> str:
        return f"{self.root}/store/connection"

    @property
    def partitions(self) -> str:
        return f"{self.root}/store/partition"

    def partition(self, partition_id: int) -> str:
        return f"{self.root}/store/partition/{partition_id}"

    @property
    def server(self) -> str:
        return f"{self.root}/server"

    @property
    def members(self) -> str:
        """Parent of the servers' ephemeral sequential member znodes."""
        return f"{self.root}/server/members"

    @property
    def election(self) -> str:
        """The cluster manager's election znode."""
        return f"{self.root}/server/election"

    @property
    def server_assignment(self) -> str:
        """The partition assignment written by the cluster manager."""
        return f"{self.root}/server/assignment"

    @property
    def archive(self) -> str:
        """The archive's summary, written by the archiver (absent until its first run)."""
        return f"{self.root}/archive"


class ClusterZk:
    """Read and write one cluster's znodes.

    Args:
        zk: a started kazoo client (the caller owns it).
        root: the cluster root znode path.
    """

    def __init__(self, zk: KazooClient, root: str) -> None:
        self.zk = zk
        self.paths = ClusterPaths.of(root)

    # ---- the cluster as a whole ----

    def exists(self) -> bool:
        """True when a cluster exists under the root."""
        return self.zk.exists(self.paths.cluster) is not None

    def create(
        self,
        params: ClusterParams,
        assignments: ReplicaAssignments,
        groups: GroupDescriptor,
        connection: ConnectionMetadata,
        *,
        partitions: Mapping[int, PartitionMetadata] | None = None,
        archive: ArchiveSummary | None = None,
    ) -> None:
        """Create every znode of a new cluster in one ZooKeeper transaction.

        Every partition starts with generation 0, no store session and no replica states, unless
        ``partitions`` gives its metadata (a cluster restored from its archive: the replicas'
        closing high-water mark at the archive's end, docs/design/archive.md, "Restoring a
        cluster from the archive"); ``archive`` creates ``<root>/archive`` with them.

        Raises:
            MetadataError: a cluster already exists under the root, or the values disagree.
        """
        initial = dict(partitions or {})
        outside = sorted(p for p in initial if not 0 <= p < params.num_partitions)
        if outside:
            raise MetadataError(f"partition metadata given for partitions {outside} outside the cluster")
        for storage, held in assignments.replicas.items():
            bad = [p for p in held if not 0 <= p < params.num_partitions]
            if bad:
                raise MetadataError(
                    f"storage {storage} is assigned partitions {bad} outside 0..{params.num_partitions - 1}"
                )
        with zookeeper_access(self.zk, f"creating the cluster under {self.paths.root}"):
            self._ensure_root()
        transaction = self.zk.transaction()
        transaction.create(self.paths.cluster, params.encode())
        transaction.create(self.paths.store, b"")
        transaction.create(self.paths.assignment, assignments.encode())
        transaction.create(self.paths.group, groups.encode())
        transaction.create(self.paths.connection, connection.encode())
        transaction.create(self.paths.partitions, b"")
        for pid in range(params.num_partitions):
            transaction.create(
                self.paths.partition(pid), initial.get(pid, PartitionMetadata(0, -1, {})).encode()
            )
        if archive is not None:
            transaction.create(self.paths.archive, archive.encode())
        with zookeeper_access(self.zk, f"creating the cluster under {self.paths.root}"):
            results = transaction.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if any(isinstance(r, NodeExistsError) for r in failures):
                raise MetadataError(f"a cluster already exists under {self.paths.root}; delete it first")
            raise MetadataError(f"creating the cluster under {self.paths.root} failed: {failures[0]!r}")
        log.info("created cluster %r under %s", params.name, self.paths.root)

    def _ensure_root(self) -> None:
        """Create the root with the session's ACL; its parents, holding nothing, open to all.

        Open parents let clusters with different credentials share one (``/waltz``); nobody can
        delete a protected root holding znodes through them. A root that exists already (made by
        an operator, or left by an older version) and holds nothing gets the session's ACL.
        """
        parent = self.paths.root.rsplit("/", 1)[0]
        if parent:
            self.zk.ensure_path(parent, acl=OPEN_ACL_UNSAFE)
        try:
            self.zk.create(self.paths.root, b"")
        except NodeExistsError:
            if self.zk.default_acl and not self.zk.get_children(self.paths.root):
                self.zk.set_acls(self.paths.root, self.zk.default_acl)

    def secure(self) -> int:
        """Give every znode of the cluster the session's ACL (an existing cluster made without one).

        Walks the root and everything below it, ephemeral member znodes included, setting the ACL
        of the session's digest credential (docs/design/zookeeper.md, "Security"). Idempotent;
        znodes deleted during the walk are skipped.

        Returns:
            The number of znodes whose ACL was set.

        Raises:
            MetadataError: the session has no digest credential (nothing to apply).
            ClusterNotFoundError: no cluster exists under the root.
            ZooKeeperAuthError: a znode is protected by another credential.
        """
        acl = self.zk.default_acl
        if not acl:
            raise MetadataError(
                "no digest credential is configured: set the one the cluster should be protected "
                "with (zookeeper.auth.digestFile or WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE), then run this again"
            )
        if not self.exists():
            raise ClusterNotFoundError(f"no cluster under {self.paths.root}")
        count = 0
        pending = [self.paths.root]
        with zookeeper_access(self.zk, f"setting the ACLs under {self.paths.root}"):
            while pending:
                path = pending.pop()
                try:
                    children = self.zk.get_children(path)
                    self.zk.set_acls(path, acl)
                except NoNodeError:
                    continue
                count += 1
                pending.extend(f"{path}/{child}" for child in children)
        log.info("set the digest ACL of %d znodes under %s", count, self.paths.root)
        return count

    def delete(self) -> None:
        """Delete the cluster's znodes (everything under the root, and the root).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
        """
        if not self.exists():
            raise ClusterNotFoundError(f"no cluster under {self.paths.root}")
        with zookeeper_access(self.zk, f"deleting the cluster under {self.paths.root}"):
            self.zk.delete(self.paths.root, recursive=True)
        log.info("deleted the cluster under %s", self.paths.root)

    # ---- single znodes ----

    def _read(self, path: str) -> tuple[bytes, int]:
        try:
            with zookeeper_access(self.zk, f"reading {path}"):
                data, stat = self.zk.get(path)
        except NoNodeError:
            if not self.exists():
                raise ClusterNotFoundError(
                    f"no cluster under {self.paths.root}: create one with `waltz cluster create`"
                ) from None
            raise MetadataError(f"znode {path} is missing") from None
        return data, stat.version

    def _write(self, path: str, value: _Codec, version: int) -> int:
        try:
            with zookeeper_access(self.zk, f"writing {path}"):
                stat = self.zk.set(path, value.encode(), version=version)
        except BadVersionError:
            raise StaleMetadataError(f"znode {path} changed since version {version}") from None
        return int(stat.version)

    def params(self) -> ClusterParams:
        """The cluster parameters.

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
        """
        data, _ = self._read(self.paths.cluster)
        return ClusterParams.decode(data, self.paths.cluster)

    def assignments(self) -> Versioned[ReplicaAssignments]:
        """The replica assignments and their znode version."""
        data, version = self._read(self.paths.assignment)
        return Versioned(ReplicaAssignments.decode(data, self.paths.assignment), version)

    def set_assignments(self, value: ReplicaAssignments, version: int) -> int:
        """Compare-and-set the replica assignments; returns the new version.

        Raises:
            StaleMetadataError: the znode changed since ``version``.
        """
        return self._write(self.paths.assignment, value, version)

    def groups(self) -> Versioned[GroupDescriptor]:
        """The group descriptor and its znode version."""
        data, version = self._read(self.paths.group)
        return Versioned(GroupDescriptor.decode(data, self.paths.group), version)

    def set_groups(self, value: GroupDescriptor, version: int) -> int:
        """Compare-and-set the group descriptor; returns the new version."""
        return self._write(self.paths.group, value, version)

    def connection(self) -> Versioned[ConnectionMetadata]:
        """The storage admin ports and their znode version."""
        data, version = self._read(self.paths.connection)
        return Versioned(ConnectionMetadata.decode(data, self.paths.connection), version)

    def set_connection(self, value: ConnectionMetadata, version: int) -> int:
        """Compare-and-set the storage admin ports; returns the new version."""
        return self._write(self.paths.connection, value, version)

    def partition_metadata(self, partition_id: int) -> Versioned[PartitionMetadata]:
        """A partition's metadata and its znode version."""
        path = self.paths.partition(partition_id)
        data, version = self._read(path)
        return Versioned(PartitionMetadata.decode(data, path), version)

    def set_partition_metadata(self, partition_id: int, value: PartitionMetadata, version: int) -> int:
        """Compare-and-set a partition's metadata; returns the new version.

        Raises:
            StaleMetadataError: the znode changed since ``version``.
        """
        return self._write(self.paths.partition(partition_id), value, version)

    def archive_summary(self) -> Versioned[ArchiveSummary] | None:
        """The archive's summary and its znode version, or None before the archiver's first run.

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the znode does not decode.
        """
        path = self.paths.archive
        try:
            with zookeeper_access(self.zk, f"reading {path}"):
                data, stat = self.zk.get(path)
        except NoNodeError:
            if not self.exists():
                raise ClusterNotFoundError(f"no cluster under {self.paths.root}") from None
            return None
        return Versioned(ArchiveSummary.decode(data, path), stat.version)

    def set_archive_summary(self, value: ArchiveSummary, version: int) -> int:
        """Create (``version`` -1) or compare-and-set the archive's summary; returns the new version.

        The znode is created with the session's default ACL, like every znode of the cluster.

        Raises:
            StaleMetadataError: the znode was created or changed since ``version``.
        """
        path = self.paths.archive
        if version >= 0:
            return self._write(path, value, version)
        try:
            with zookeeper_access(self.zk, f"creating {path}"):
                self.zk.create(path, value.encode())
        except NodeExistsError:
            raise StaleMetadataError(f"znode {path} was created by another writer") from None
        return 0

    def begin_store_session(
        self, partition_id: int, generation: int
    ) -> tuple[PartitionMetadata, Versioned[PartitionMetadata]]:
        """Take a new store session ID for a partition (docs/design/recovery.md "Taking a store session ID").

        The new session ID is the stored one plus one and the stored generation becomes
        ``generation``; written by compare-and-set, retried when someone else wrote first.

        Returns:
            The metadata as it was before (the last session's replica states) and the metadata
            of the new session with its znode version.

        Raises:
            GenerationFencedError: the stored generation is higher than ``generation``: a newer
                server owns the partition (a paused old owner must never fence the real one).
            StaleMetadataError: too many concurrent writers.
        """
        for _ in range(MAX_CAS_ATTEMPTS):
            current = self.partition_metadata(partition_id)
            if current.value.generation > generation:
                raise GenerationFencedError(partition_id, generation, current.value.generation)
            new = current.value.evolve(generation=generation, session_id=current.value.session_id + 1)
            try:
                version = self.set_partition_metadata(partition_id, new, current.version)
            except StaleMetadataError:
                continue
            log.info(
                "partition %d: store session %d (generation %d)", partition_id, new.session_id, generation
            )
            return current.value, Versioned(new, version)
        raise StaleMetadataError(
            f"partition {partition_id}: gave up taking a new store session after {MAX_CAS_ATTEMPTS} attempts"
        )
