"""The cluster's znodes in ZooKeeper, read and written with compare-and-set (kazoo).

Layout under the cluster root (``docs/zookeeper.md``)::

    <root>/cluster                  ClusterParams (name, number of partitions, cluster key)
    <root>/discovery                DiscoveryParams (name, number of partitions: what clients read)
    <root>/roles                    ClusterRoles (the digest identity of each role)
    <root>/store/assignment         ReplicaAssignments (storage connect string -> partitions)
    <root>/store/group              GroupDescriptor (storage connect string -> group)
    <root>/store/connection         ConnectionMetadata (storage connect string -> admin port)
    <root>/store/partition/<id>     PartitionMetadata (generation, session ID, replica states)
    <root>/server/...               server membership and partition assignment (cluster manager)
    <root>/archive                  ArchiveSummary (the archive's location, per partition what it holds)
    <root>/partitions/epochs        PartitionEpochs (the splits' epochs: waltz.metadata.epochs)

A cluster created with role credentials gives every znode an ACL per role
(:mod:`waltz.metadata.zk_roles`); one created with a single credential gives every znode all
rights to that credential alone (docs/design/zookeeper.md, "Security"). A refused access raises
:class:`~waltz.metadata.zk_session.ZooKeeperAuthError`; a root or child znode open to anyone or to
an unknown identity makes :meth:`ClusterZk.check_security` raise
:class:`~waltz.metadata.zk_roles.ZnodeAclError`.

Nothing here is on the append path: znodes change only on faults and assignment changes.
The methods block (kazoo's synchronous API); async callers run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL, Id, Permissions

from waltz.errors import ClusterNotFoundError, GenerationFencedError, MetadataError, StaleMetadataError
from waltz.metadata.missing_cluster import missing_cluster_message
from waltz.metadata.paths import ClusterPaths
from waltz.metadata.values import (
    NO_PREFERRED_PARTITIONS,
    ArchiveSummary,
    ClusterParams,
    ConnectionMetadata,
    DiscoveryParams,
    GroupDescriptor,
    PartitionMetadata,
    ReplicaAssignments,
)
from waltz.metadata.zk_access import ClusterAccess
from waltz.metadata.zk_roles import ClusterRoles, Role, session_identities
from waltz.metadata.zk_session import ZooKeeperUnavailableError, get_within, zookeeper_access

__all__ = ["PARENT_ACL", "ClusterPaths", "ClusterZk", "Versioned"]

log = logging.getLogger(__name__)

#: Attempts of a compare-and-set loop before giving up (each attempt re-reads the znode).
MAX_CAS_ATTEMPTS = 50

#: The ACL of the parents of a root that ``create`` makes (docs/design/zookeeper.md, "Security"):
#: anyone may list, create and delete children (clusters with other credentials share them; a
#: protected root holding znodes cannot be deleted), no one may write or change the ACL.
PARENT_ACL = [ACL(Permissions.CREATE | Permissions.READ | Permissions.DELETE, Id("world", "anyone"))]


class _Codec(Protocol):
    def encode(self) -> bytes: ...


V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Versioned(Generic[V]):
    """A znode's decoded value and its version (for compare-and-set)."""

    value: V
    version: int


class ClusterZk:
    """Read and write one cluster's znodes.

    Args:
        zk: a started kazoo client (the caller owns it).
        root: the cluster root znode path.
        timeout: seconds a read or a compare-and-set of a single znode waits for ZooKeeper's
            answer (:meth:`params`, :meth:`assignments`, :meth:`partition_metadata`, their
            setters, :meth:`exists`...); None waits as long as kazoo does, which, cut off from
            ZooKeeper, is until the connection comes back or the client stops. A server passes
            its session timeout, so that no call holds its stop (docs/design/server.md,
            "Stopping within a bound").
    """

    def __init__(self, zk: KazooClient, root: str, *, timeout: float | None = None) -> None:
        self.zk = zk
        self.paths = ClusterPaths.of(root)
        self.timeout = timeout
        self.access = ClusterAccess(zk, self.paths, timeout=timeout)
        """The ACLs of the cluster's znodes: the root check, ``secure`` (:mod:`waltz.metadata.zk_access`)."""

    def _get(self, path: str) -> tuple[bytes, ZnodeStat]:
        """``zk.get`` within :attr:`timeout`.

        Raises:
            ZooKeeperUnavailableError: ZooKeeper did not answer in time.
            NoNodeError: as ``zk.get``.
        """
        return get_within(self.zk, path, self.timeout)

    def _set(self, path: str, data: bytes, version: int) -> ZnodeStat:
        """``zk.set`` within :attr:`timeout`.

        Raises:
            ZooKeeperUnavailableError: ZooKeeper did not answer in time (the write may have
                happened: the next compare-and-set finds out).
            BadVersionError: as ``zk.set``.
        """
        if self.timeout is None:
            return self.zk.set(path, data, version=version)
        try:
            return self.zk.set_async(path, data, version=version).get(timeout=self.timeout)
        except self.zk.handler.timeout_exception:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper did not answer a write of {path} within {self.timeout:g}s"
            ) from None

    # ---- the cluster as a whole ----

    def exists(self) -> bool:
        """True when a cluster exists under the root."""
        path = self.paths.cluster
        if self.timeout is None:
            return self.zk.exists(path) is not None
        try:
            return self.zk.exists_async(path).get(timeout=self.timeout) is not None
        except self.zk.handler.timeout_exception:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper did not answer whether {path} exists within {self.timeout:g}s"
            ) from None

    def create(
        self,
        params: ClusterParams,
        assignments: ReplicaAssignments,
        groups: GroupDescriptor,
        connection: ConnectionMetadata,
        *,
        partitions: Mapping[int, PartitionMetadata] | None = None,
        archive: ArchiveSummary | None = None,
        roles: ClusterRoles | None = None,
    ) -> None:
        """Create every znode of a new cluster in one ZooKeeper transaction.

        Every partition starts with generation 0, no store session and no replica states, unless
        ``partitions`` gives its metadata (a cluster restored from its archive: the replicas'
        closing high-water mark at the archive's end, docs/design/archive.md, "Restoring a
        cluster from the archive"); ``archive`` creates ``<root>/archive`` with them.

        With ``roles`` every znode gets the ACL of its role table (:mod:`waltz.metadata.zk_roles`),
        ``<root>/roles`` records the identities, and the znodes servers and clients would
        otherwise create (``server``, ``server/members``, ``client``, ``client/id``) are made
        with theirs, with ``client/ids``, where clients take their IDs; the session must hold
        the operator's credential. Without, every znode gets the session's default ACL
        (docs/design/zookeeper.md, "Security").

        Raises:
            MetadataError: a cluster already exists under the root, or the values disagree, or
                the session does not hold the operator's credential of ``roles``.
            ZnodeAclError: the root exists already, holds znodes, and is open to anyone or to
                an unknown identity.
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
        if roles is not None and roles.operator not in session_identities(self.zk):
            raise MetadataError(
                "creating a cluster with role credentials needs a session holding the operator's credential"
            )

        def acl(path: str) -> list[ACL] | None:
            return roles.acl_for(self.paths.relative(path)) if roles is not None else None

        with zookeeper_access(self.zk, f"creating the cluster under {self.paths.root}"):
            self._ensure_root(roles)
        transaction = self.zk.transaction()
        transaction.create(self.paths.cluster, params.encode(), acl=acl(self.paths.cluster))
        transaction.create(
            self.paths.discovery, DiscoveryParams.of(params).encode(), acl=acl(self.paths.discovery)
        )
        values = [
            (self.paths.store, b""),
            (self.paths.assignment, assignments.encode()),
            (self.paths.group, groups.encode()),
            (self.paths.connection, connection.encode()),
            (self.paths.partitions, b""),
        ]
        values += [
            (self.paths.partition(pid), initial.get(pid, PartitionMetadata(0, -1, {})).encode())
            for pid in range(params.num_partitions)
        ]
        if archive is not None:
            values.append((self.paths.archive, archive.encode()))
        if roles is not None:
            values.append((self.paths.roles, roles.encode()))
            values += [(path, b"") for path in (self.paths.server, self.paths.members)]
            values.append((self.paths.server_preferred, NO_PREFERRED_PARTITIONS))
            values += [(path, b"") for path in (self.paths.client, self.paths.client_id)]
            values.append((self.paths.client_ids, b"0"))  # no ID handed out by the counter
        for path, data in values:
            transaction.create(path, data, acl=acl(path))
        with zookeeper_access(self.zk, f"creating the cluster under {self.paths.root}"):
            results = transaction.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if any(isinstance(r, NodeExistsError) for r in failures):
                raise MetadataError(f"a cluster already exists under {self.paths.root}; delete it first")
            raise MetadataError(f"creating the cluster under {self.paths.root} failed: {failures[0]!r}")
        if roles is not None:
            self.zk.default_acl = roles.default_acl(Role.OPERATOR)
        log.info("created cluster %r under %s", params.name, self.paths.root)

    def _ensure_root(self, roles: ClusterRoles | None) -> None:
        """Create the root with its ACL; its missing parents, holding nothing, with :data:`PARENT_ACL`.

        Parents anyone may create in let clusters with different credentials share one
        (``/waltz``); nobody can delete a protected root holding znodes through them, nor take a
        parent over (no one holds ``ADMIN`` or ``WRITE`` on it). A root that exists already (made by
        an operator, or left by an older version) and holds nothing gets the root's ACL; one
        holding znodes must pass :meth:`ClusterAccess.check_root` (a squatter's root is refused).

        Raises:
            ZnodeAclError: the root holds znodes and lets in anyone or an unknown identity.
        """
        parent = self.paths.root.rsplit("/", 1)[0]
        if parent:
            self.zk.ensure_path(parent, acl=PARENT_ACL)
        root_acl = roles.acl_for("") if roles is not None else self.zk.default_acl
        try:
            self.zk.create(self.paths.root, b"", acl=root_acl)
            return
        except NodeExistsError:
            pass
        if root_acl and not self.zk.get_children(self.paths.root):
            self.zk.set_acls(self.paths.root, root_acl)
        self.access.check_root(roles)

    def close_above_root(self, roles: ClusterRoles) -> list[str]:
        """Let anyone only read ``/``, the root's parents and ZooKeeper's own ``/zookeeper`` (its
        ``quota``, open to all by default); the operator role does all. Call it before
        :meth:`create`, which would make missing parents with :data:`PARENT_ACL`.

        For an ensemble the cluster has to itself (a local cluster's own ZooKeeper), which
        nothing else writes to: ZooKeeper holds every znode in memory, and an anonymous session
        creating znodes where it may would exhaust it (docs/design/zookeeper.md, "Security").
        Idempotent.

        Returns:
            The znodes whose ACL changed.
        """
        acl = [ACL(Permissions.READ, Id("world", "anyone")), *roles.acl({Role.OPERATOR: Permissions.ALL})]
        changed: list[str] = []

        def close(path: str, current: list[ACL]) -> None:
            if sorted(map(str, current)) == sorted(map(str, acl)):
                return
            try:
                self.zk.set_acls(path, acl)
                changed.append(path)
            except NoAuthError:
                log.warning("ZooKeeper's %s keeps its ACL %s: this session may not change it", path, current)

        for path in ["/", *self.paths.parents]:
            try:
                self.zk.create(path, b"", acl=acl)
                changed.append(path)
            except NodeExistsError:
                close(path, self.zk.get_acls(path)[0])
        for path in ["/zookeeper", *(f"/zookeeper/{child}" for child in self.zk.get_children("/zookeeper"))]:
            current = self.zk.get_acls(path)[0]
            if any(entry.id.scheme == "world" and entry.perms & ~Permissions.READ for entry in current):
                close(path, current)  # its read-only znodes (/zookeeper/config) stay as they are
        return changed

    def check_security(self, role: Role | None = None) -> ClusterRoles | None:
        """Check the root before using the cluster and adopt the session's role ACL
        (:meth:`ClusterAccess.check_security <waltz.metadata.zk_access.ClusterAccess.check_security>`).

        Args:
            role: the role the process runs as (a server: ``Role.SERVER``); in a cluster made with
                role credentials, a session holding another role's credential is refused. None:
                any of the cluster's roles.

        Raises:
            ZnodeAclError: the root or a child lets in anyone or an unknown identity.
            ZooKeeperAuthError: the session's credential is none of the cluster's, or another
                role's than ``role``.
        """
        return self.access.check_security(role)

    def discovery(self) -> DiscoveryParams:
        """The name and number of partitions, from ``<root>/discovery`` or, in a cluster made
        before that znode existed, from ``<root>/cluster``.

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            ZooKeeperAuthError: the session may not read them.
        """
        try:
            with zookeeper_access(self.zk, f"reading {self.paths.discovery}"):
                data, _ = self._get(self.paths.discovery)
        except NoNodeError:
            return DiscoveryParams.of(self.params())
        return DiscoveryParams.decode(data, self.paths.discovery)

    def set_discovery_epoch(self, epoch: int) -> DiscoveryParams:
        """Write the newest epoch of ``partitions/epochs`` into ``<root>/discovery`` by
        compare-and-set (docs/design/splits.md "What ZooKeeper holds", "The handover" step 2).

        From epoch 1 on the znode has a raised format (:data:`~waltz.metadata.values.
        DISCOVERY_SPLIT_FORMAT`), which a client that reads format 1 only refuses; epoch 0 writes
        format 1 again, the same bytes as before any split (an aborted first split). A cluster
        made before ``discovery`` existed gets the znode, with the ACL of its role table.

        Args:
            epoch: the newest epoch, finished or not (0: none).

        Returns:
            The znode's value after the write (the same when it held ``epoch`` already).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            StaleMetadataError: the znode kept changing.
            ZooKeeperAuthError: the session may not write it (only operators may).
            ZooKeeperUnavailableError: ZooKeeper did not answer within :attr:`timeout`.
        """
        path = self.paths.discovery
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                with zookeeper_access(self.zk, f"reading {path}"):
                    data, stat = self._get(path)
            except NoNodeError:
                current, version = DiscoveryParams.of(self.params()), -1
            else:
                current, version = DiscoveryParams.decode(data, path), stat.version
            if current.epoch == epoch:
                return current
            new = replace(current, epoch=epoch)
            try:
                if version >= 0:
                    self._write(path, new, version)
                else:
                    roles = self.access.roles()
                    acl = roles.acl_for(self.paths.relative(path)) if roles is not None else None
                    with zookeeper_access(self.zk, f"creating {path}"):
                        created = self.zk.create_async(path, new.encode(), acl=acl)
                        try:
                            created.get(timeout=self.timeout)
                        except self.zk.handler.timeout_exception:
                            raise ZooKeeperUnavailableError(
                                f"ZooKeeper did not answer a create of {path} within {self.timeout:g}s"
                            ) from None
            except (StaleMetadataError, NodeExistsError):
                continue
            log.info("%s: epoch %d", path, epoch)
            return new
        raise StaleMetadataError(f"znode {path} kept changing: gave up after {MAX_CAS_ATTEMPTS} attempts")

    def delete(self) -> None:
        """Delete the cluster's znodes (everything under the root, and the root).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
        """
        if not self.exists():
            raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths))
        with zookeeper_access(self.zk, f"deleting the cluster under {self.paths.root}"):
            self.zk.delete(self.paths.root, recursive=True)
        log.info("deleted the cluster under %s", self.paths.root)

    # ---- single znodes ----

    def _read(self, path: str) -> tuple[bytes, int]:
        try:
            with zookeeper_access(self.zk, f"reading {path}"):
                data, stat = self._get(path)
        except NoNodeError:
            if not self.exists():
                raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths)) from None
            raise MetadataError(f"znode {path} is missing") from None
        return data, stat.version

    def _write(self, path: str, value: _Codec, version: int) -> int:
        try:
            with zookeeper_access(self.zk, f"writing {path}"):
                stat = self._set(path, value.encode(), version)
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

    def create_partition_metadata(self, partition_id: int, value: PartitionMetadata) -> int:
        """Create ``store/partition/<partition_id>`` for a partition made after the cluster (a
        split's new child, docs/design/splits.md "The handover", step 4), with the ACL of the role
        table in a cluster made with roles, else the session's default ACL; returns its version, 0.

        Raises:
            StaleMetadataError: the znode exists already (read it and decide again).
            ClusterNotFoundError: no cluster exists under the root.
        """
        path = self.paths.partition(partition_id)
        if not self.exists():
            raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths))
        with zookeeper_access(self.zk, f"creating {path}"):
            roles = self.access.roles()
            acl = roles.acl_for(self.paths.relative(path)) if roles is not None else None
            try:
                self.zk.create(path, value.encode(), acl=acl)
            except NodeExistsError:
                raise StaleMetadataError(f"znode {path} was created by another writer") from None
        return 0

    def partition_metadata_if_any(self, partition_id: int) -> Versioned[PartitionMetadata] | None:
        """A partition's metadata and its znode version, or None when the znode does not exist (a
        split's new child before it is opened).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the znode does not decode.
        """
        path = self.paths.partition(partition_id)
        try:
            with zookeeper_access(self.zk, f"reading {path}"):
                data, stat = self._get(path)
        except NoNodeError:
            if not self.exists():
                raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths)) from None
            return None
        return Versioned(PartitionMetadata.decode(data, path), stat.version)

    def archive_summary(self) -> Versioned[ArchiveSummary] | None:
        """The archive's summary and its znode version, or None before the archiver's first run.

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the znode does not decode.
        """
        path = self.paths.archive
        try:
            with zookeeper_access(self.zk, f"reading {path}"):
                data, stat = self._get(path)
        except NoNodeError:
            if not self.exists():
                raise ClusterNotFoundError(missing_cluster_message(self.zk, self.paths)) from None
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
