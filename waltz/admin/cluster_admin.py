"""Cluster administration: create, describe, verify and delete a cluster (``waltz cluster``).

Design: docs/design/zookeeper.md "Replica assignments and groups", "Partition metadata";
docs/design/storage.md "Admin port". :mod:`waltz.cli.cluster` is a thin layer over
:class:`ClusterAdmin`; storage node and replica changes are
:class:`~waltz.admin.storage_admin.StorageNodeAdmin` (``ClusterAdmin.storage``).
``docs/zookeeper.md`` documents every znode and rule.

Public API::

    with ClusterAdmin.connect("zk1:2181", "/waltz/cluster1", storage_timeout=5) as admin:
        result = admin.create("orders", 8, [StorageSpec.parse("10.0.0.1:55280=55281")])
        admin.describe()                # ClusterDescription
        admin.verify()                  # VerifyReport (.passed, .checks)
        admin.storage.assign("10.0.0.2:55280", [0, 1])
        admin.delete(unassign_storage=True)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from kazoo.client import KazooClient

from waltz.admin.description import ClusterDescription, describe_cluster
from waltz.admin.storage_admin import StorageNodeAdmin
from waltz.admin.storage_nodes import (
    DEFAULT_STORAGE_TIMEOUT,
    StorageUnreachableError,
    call_admin_on_nodes,
    probe_tcp,
)
from waltz.admin.verify import VerifyReport, probe_storage_nodes
from waltz.admin.verify_all import cluster_checks
from waltz.admin.verify_servers import probe_servers
from waltz.errors import ConfigurationError, MetadataError
from waltz.metadata.assignment import read_assignment, read_members
from waltz.metadata.replicas import spread_replicas
from waltz.metadata.values import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
    check_connect_string,
)
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_roles import KNOWN_CHILDREN, RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import (
    DEFAULT_ZOOKEEPER_TIMEOUT,
    ZooKeeperUnavailableError,
    connect_zookeeper,
    zookeeper_errors,
)
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient

__all__ = [
    "ClusterAdmin",
    "CreateResult",
    "DeleteResult",
    "StorageSetup",
    "StorageSpec",
    "ZooKeeperUnavailableError",
]

log = logging.getLogger(__name__)

#: The znodes a cluster root may hold (zk.py); ``delete`` refuses a root holding anything else,
#: so that a wrong ``--root`` (a parent of other clusters, say) is never wiped.
CLUSTER_ROOT_CHILDREN = KNOWN_CHILDREN


@dataclass(frozen=True, slots=True)
class StorageSpec:
    """A storage node given to ``waltz cluster create``: ``host:port=admin_port[,group]``.

    Attributes:
        connect_string: ``host:port`` of the storage port (the node's name in ZooKeeper).
        admin_port: the node's admin port.
        group: the node's replica group (docs/design/zookeeper.md "Replica assignments and
            groups"), 0 by default.
    """

    connect_string: str
    admin_port: int
    group: int = 0

    @property
    def admin_address(self) -> str:
        """``host:admin_port``."""
        return f"{self.connect_string.rpartition(':')[0]}:{self.admin_port}"

    @classmethod
    def parse(cls, text: str) -> StorageSpec:
        """Parse ``host:port=admin_port[,group]``.

        Raises:
            ConfigurationError: the text is not of that form.
        """
        connect_string, sep, rest = text.partition("=")
        admin, _, group = rest.partition(",")
        try:
            check_connect_string(connect_string)
            if not sep or not admin.isdigit() or not 0 < int(admin) < 65536:
                raise ValueError
            if group and not group.lstrip("-").isdigit():
                raise ValueError
        except (MetadataError, ValueError):
            raise ConfigurationError(
                f"--storage {text!r} must be host:port=admin_port[,group], e.g. 10.0.0.1:55280=55281,0"
            ) from None
        return cls(connect_string, int(admin), int(group) if group else 0)


@dataclass(frozen=True, slots=True)
class StorageSetup:
    """What happened on one storage node during ``create``.

    Attributes:
        spec: the node.
        partitions: the partitions it is assigned in ZooKeeper.
        error: why the admin open or a partition assignment failed on the node, or None.
    """

    spec: StorageSpec
    partitions: tuple[int, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CreateResult:
    """The outcome of ``create``: the znodes exist; ``storage`` says what each node did."""

    params: ClusterParams
    storage: tuple[StorageSetup, ...]

    @property
    def ok(self) -> bool:
        """True when every storage node was initialised and assigned its partitions."""
        return all(s.error is None for s in self.storage)


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """The outcome of ``delete``.

    Attributes:
        deleted: the znodes were deleted.
        unassigned: storage connect string -> partitions removed from that node.
        failures: storage connect string -> why its partitions could not be removed.
    """

    deleted: bool
    unassigned: dict[str, tuple[int, ...]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


class ClusterAdmin:
    """Administer one cluster: its znodes under ``root`` and its storage nodes' admin ports.

    Use :meth:`connect` (which owns a ZooKeeper session; a context manager), or pass a started
    kazoo client that the caller owns. Methods block; storage calls run on an event loop of their
    own (``asyncio.run``), each node within ``storage_timeout`` seconds, so call them from
    synchronous code, or through ``asyncio.to_thread`` from a coroutine.

    Args:
        zk: a started kazoo client.
        root: the cluster root znode, e.g. ``/waltz/cluster1``.
        storage_timeout: seconds allowed for each storage node's admin call.
        tls: client TLS files for the storage admin ports, or None.
        zookeeper_timeout: seconds each read or compare-and-set of a znode waits for ZooKeeper
            (:class:`~waltz.metadata.zk.ClusterZk`); None waits as long as kazoo does.
            :meth:`connect` passes the session timeout.

    Attributes:
        cluster: the cluster's znodes.
        storage: storage node membership and replica changes.

    Raises:
        MetadataError: ``root`` is not an absolute znode path.
    """

    def __init__(
        self,
        zk: KazooClient,
        root: str,
        *,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        tls: TlsConfig | None = None,
        zookeeper_timeout: float | None = None,
    ) -> None:
        self.cluster = ClusterZk(zk, root, timeout=zookeeper_timeout)
        self.storage_timeout = storage_timeout
        self.tls = tls
        self.storage = StorageNodeAdmin(self.cluster, storage_timeout=storage_timeout, tls=tls)
        self._owned: KazooClient | None = None

    @classmethod
    def connect(
        cls,
        connect_string: str,
        root: str,
        *,
        connect_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
        session_timeout: float = DEFAULT_ZOOKEEPER_TIMEOUT,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        tls: TlsConfig | None = None,
        security: ZooKeeperSecurity | None = None,
        check_acls: bool = True,
    ) -> ClusterAdmin:
        """Connect to ZooKeeper; the returned admin owns the session (close it, or use ``with``).

        ``security`` is the cluster's ZooKeeper credential and TLS (docs/design/zookeeper.md,
        "Security"): znodes the admin creates are protected by the credential. With
        ``check_acls`` (all but the commands that repair or inspect a cluster: ``secure``,
        ``delete``, ``verify``) the cluster's root and its children are checked first
        (:meth:`~waltz.metadata.zk.ClusterZk.check_security`).

        Raises:
            ZooKeeperUnavailableError: no ZooKeeper server answered within ``connect_timeout``.
            ConfigurationError: the connect string is malformed.
            MetadataError: ``root`` is not an absolute znode path.
            ZnodeAclError: the root or a child lets in anyone or an unknown identity.
            ZooKeeperAuthError: the credential is none of the cluster's.
        """
        ClusterPaths.of(root)  # a bad root fails before waiting for ZooKeeper
        client = connect_zookeeper(
            connect_string,
            connect_timeout=connect_timeout,
            session_timeout=session_timeout,
            security=security,
        )
        try:
            admin = cls(
                client, root, storage_timeout=storage_timeout, tls=tls, zookeeper_timeout=session_timeout
            )
            if check_acls:
                zookeeper_errors(ClusterZk.check_security)(admin.cluster)
        except BaseException:
            client.stop()
            client.close()
            raise
        admin._owned = client
        return admin

    def close(self) -> None:
        """End the ZooKeeper session if this admin owns it. Idempotent."""
        client, self._owned = self._owned, None
        if client is not None:
            client.stop()
            client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def root(self) -> str:
        """The normalised cluster root."""
        return self.cluster.paths.root

    @zookeeper_errors
    def create(
        self,
        name: str,
        num_partitions: int,
        storages: Sequence[StorageSpec],
        replicas: int | None = None,
        *,
        credentials: RoleCredentials | None = None,
    ) -> CreateResult:
        """Create a cluster: znodes in one ZooKeeper transaction, then initialise the storage nodes.

        Steps: check the arguments; check that every storage node's admin port accepts TCP
        connections (nothing is written if one does not); create every znode with a new cluster
        key; then on every node, concurrently, an admin open (which initialises it with the key
        and the number of partitions) and the assignment of its partitions.

        The znodes are **not** rolled back when a storage node fails after they were written: the
        other nodes already carry the new cluster key in their control files, and a new ``create``
        would make a new key that they refuse. The result names each failed node; fix it and run
        ``waltz cluster storage assign <node> --partition ...`` (idempotent).

        Args:
            name: the cluster's name.
            num_partitions: the number of partitions (at least 1).
            storages: the storage nodes (at least 1, distinct connect strings).
            replicas: replicas per partition, spread round-robin; None puts every partition on
                every node.
            credentials: the server, operator and client credentials: the session authenticates
                as the operator and every znode gets the ACL of its role
                (docs/design/zookeeper.md, "Roles"); None: the session's own credential, if any.

        Returns:
            The parameters (with the new cluster key) and what happened on each node.

        Raises:
            ConfigurationError: bad arguments.
            StorageUnreachableError: a node's admin port refused TCP connections (nothing written).
            MetadataError: a cluster already exists under the root.
            ZnodeAclError: the root exists, holds znodes and lets in anyone or an unknown
                identity (a squatted root).
        """
        if not name:
            raise ConfigurationError("the cluster needs a name (--name)")
        if num_partitions < 1:
            raise ConfigurationError(f"--partitions {num_partitions}: a cluster needs at least 1 partition")
        names = [s.connect_string for s in storages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"storage nodes given more than once: {', '.join(duplicates)}")
        try:
            placement = spread_replicas(names, num_partitions, replicas)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if credentials is not None:
            self.cluster.zk.add_auth("digest", credentials.operator)
        roles = credentials.identities() if credentials is not None else None
        self.cluster.access.check_root(roles)  # a squatted root is refused before "already exists"
        if self.cluster.exists():
            raise MetadataError(f"a cluster already exists under {self.root}: delete it first")

        async def probe_all() -> list[str | None]:
            return await asyncio.gather(*(probe_tcp(s.admin_address, self.storage_timeout) for s in storages))

        unreachable = [
            (s, why)
            for s, why in zip(storages, run_on_shared_loop(probe_all()), strict=True)
            if why is not None
        ]
        if unreachable:
            raise StorageUnreachableError(
                ", ".join(s.admin_address for s, _ in unreachable),
                "; ".join(f"{s.connect_string} (admin {s.admin_address}): {why}" for s, why in unreachable),
                "nothing was written to ZooKeeper: start the node(s) or fix --storage, then rerun",
            )

        params = ClusterParams(name, num_partitions, uuid.uuid4())
        self.cluster.create(
            params,
            ReplicaAssignments(placement),
            GroupDescriptor({s.connect_string: s.group for s in storages}),
            ConnectionMetadata({s.connect_string: s.admin_port for s in storages}),
            roles=roles,
        )

        async def setup(storage: str, admin: StorageAdminClient) -> None:
            for partition_id in placement[storage]:
                await admin.assign_partition(partition_id, True)

        outcomes = run_on_shared_loop(
            call_admin_on_nodes(
                {s.connect_string: s.admin_address for s in storages},
                str(params.cluster_key),
                num_partitions,
                setup,
                timeout=self.storage_timeout,
                tls=self.tls,
            )
        )
        results = tuple(
            StorageSetup(s, placement[s.connect_string], outcomes[s.connect_string].failure) for s in storages
        )
        for setup_result in results:
            if setup_result.error is not None:
                log.warning("storage node %s: %s", setup_result.spec.connect_string, setup_result.error)
        return CreateResult(params, results)

    @zookeeper_errors
    def secure(self, credentials: RoleCredentials | None = None) -> int:
        """Protect every znode of the cluster (``waltz cluster secure``): with the session's
        credential, or with ``credentials`` the ACL of each znode's role, the session then
        authenticating as the operator too.

        See :meth:`~waltz.metadata.zk_access.ClusterAccess.secure` (docs/design/zookeeper.md, "Security").

        Returns:
            The number of znodes protected.

        Raises:
            MetadataError: the session has no digest credential.
            ClusterNotFoundError: no cluster exists under the root.
            ZooKeeperAuthError: a znode is protected by another credential.
        """
        if credentials is None:
            return self.cluster.access.secure()
        self.cluster.zk.add_auth("digest", credentials.operator)
        return self.cluster.access.secure(credentials.identities())

    @zookeeper_errors
    def describe(self) -> ClusterDescription:
        """Read the cluster's metadata (``waltz cluster list``).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: a znode is malformed.
        """
        return describe_cluster(self.cluster)

    @zookeeper_errors
    def verify(self) -> VerifyReport:
        """Check ZooKeeper against the storage nodes (``waltz cluster verify``).

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the cluster, assignment, group or connection znode is malformed.
        """
        description = self.describe()
        probes = run_on_shared_loop(
            probe_storage_nodes(description, timeout=self.storage_timeout, tls=self.tls)
        )
        members = read_members(self.cluster.zk, self.cluster.paths)
        assignment, _ = read_assignment(self.cluster.zk, self.cluster.paths)
        servers = run_on_shared_loop(probe_servers(members, timeout=self.storage_timeout, tls=self.tls))
        return cluster_checks(self.cluster, description, probes, assignment, servers)

    @zookeeper_errors
    def delete(self, *, unassign_storage: bool = False, delete_storage_files: bool = False) -> DeleteResult:
        """Delete the cluster's znodes, after removing its partitions from the storage nodes if asked.

        With ``unassign_storage``, every node's assigned partitions are removed through its admin
        port first (their files too with ``delete_storage_files``); if a node fails, nothing is
        deleted in ZooKeeper, so the command can be rerun once it is fixed. The nodes keep their
        control file (and cluster key): to reuse one in another cluster, give it a fresh directory.

        Raises:
            ClusterNotFoundError: no cluster exists under the root.
            MetadataError: the root holds znodes that are not the cluster's (a wrong ``--root``).
        """
        description = self.describe()
        unexpected = sorted(set(self.cluster.zk.get_children(self.root)) - CLUSTER_ROOT_CHILDREN)
        if unexpected:
            raise MetadataError(
                f"refusing to delete {self.root}: besides the cluster it holds {', '.join(unexpected)}; "
                "check --root (it must be the cluster's own root), or remove those znodes first"
            )
        unassigned: dict[str, tuple[int, ...]] = {}
        failures: dict[str, str] = {}
        if unassign_storage:
            targets = {n.connect_string: n for n in description.storage_nodes if n.partitions}
            for storage, node in targets.items():
                if node.admin_address is None:
                    failures[storage] = "no admin port in store/connection"

            async def remove(storage: str, admin: StorageAdminClient) -> None:
                for partition_id in targets[storage].partitions:
                    await admin.assign_partition(
                        partition_id, False, delete_storage_files=delete_storage_files
                    )

            addresses = {s: n.admin_address for s, n in targets.items() if n.admin_address is not None}
            outcomes = run_on_shared_loop(
                call_admin_on_nodes(
                    addresses,
                    str(description.params.cluster_key),
                    description.params.num_partitions,
                    remove,
                    timeout=self.storage_timeout,
                    tls=self.tls,
                )
            )
            for storage, outcome in outcomes.items():
                if outcome.failure is None:
                    unassigned[storage] = targets[storage].partitions
                else:
                    failures[storage] = outcome.failure
            if failures:
                return DeleteResult(False, unassigned, failures)
        self.cluster.delete()
        return DeleteResult(True, unassigned, failures)
