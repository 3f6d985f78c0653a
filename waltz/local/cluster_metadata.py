"""The local cluster supervisor's ZooKeeper session: the cluster's znodes, as it creates and reads them.

Design: docs/design/zookeeper.md, "What lives in ZooKeeper". :class:`ClusterMetadata` creates a
local cluster through :class:`~waltz.admin.cluster_admin.ClusterAdmin` (or checks the one a kept
work directory resumes), reads which server owns which partition and which storage node holds
which replicas, and at close deletes the cluster's root when asked to (a cluster on an external
ZooKeeper leaves nothing behind there).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz.admin.cluster_admin import ClusterAdmin, StorageSpec
from waltz.errors import ConfigurationError
from waltz.local.nodes import LocalStorageNode
from waltz.local.processes import ServiceStartError
from waltz.local.readiness import LOG_TAIL_LINES
from waltz.metadata.assignment import read_assignment
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_roles import RoleCredentials
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import connect_zookeeper
from waltz.protocol.channels import TlsConfig

__all__ = ["ClusterMetadata"]

log = logging.getLogger(__name__)


class ClusterMetadata:
    """The supervisor's session with one local cluster's znodes, from :meth:`connect` to :meth:`close`.

    Args:
        delete_root: delete the cluster's root at :meth:`close`, if this session created the
            cluster or resumed it.
    """

    def __init__(self, *, delete_root: bool) -> None:
        self._delete_root = delete_root
        self._zk: KazooClient | None = None
        self._paths: ClusterPaths | None = None
        self._connect_string: str | None = None
        self._owns_root = False

    @property
    def client(self) -> KazooClient:
        """The ZooKeeper session.

        Raises:
            RuntimeError: not connected (the cluster is not started).
        """
        if self._zk is None:
            raise RuntimeError("the local cluster is not started")
        return self._zk

    @property
    def paths(self) -> ClusterPaths:
        """The cluster's znodes.

        Raises:
            RuntimeError: not connected (the cluster is not started).
        """
        if self._paths is None:
            raise RuntimeError("the local cluster is not started")
        return self._paths

    def connect(
        self, connect_string: str, paths: ClusterPaths, *, timeout: float, security: ZooKeeperSecurity
    ) -> None:
        """Open the session (with the cluster's credential and ZooKeeper TLS files, if any).

        Raises:
            ZooKeeperUnavailableError: ZooKeeper did not answer within ``timeout`` seconds.
        """
        self._zk = connect_zookeeper(
            connect_string, connect_timeout=timeout, session_timeout=10.0, security=security
        )
        self._paths = paths
        self._connect_string = connect_string

    def create(
        self,
        name: str,
        partitions: int,
        replicas: int,
        storages: Mapping[str, LocalStorageNode],
        *,
        tls: TlsConfig | None,
        resuming: bool,
        credentials: RoleCredentials | None = None,
    ) -> str:
        """Create the cluster in ZooKeeper and on the storage nodes (or check the resumed one).

        Args:
            name: the cluster's name.
            partitions: the number of partitions.
            replicas: replicas per partition.
            storages: the storage nodes by the connect string servers dial for them.
            tls: client TLS files for the storage admin ports, or None.
            resuming: a kept work directory's cluster starts again (its znodes may exist).
            credentials: the ZooKeeper credential of each role: every znode gets its role's ACL
                (docs/design/zookeeper.md, "Roles"); None: the session's own.

        Returns:
            The cluster key.

        Raises:
            ConfigurationError: a cluster exists under the root already (a new cluster), or it
                has another number of partitions (a resumed one).
            ServiceStartError: a storage node refused the cluster; the message ends with its log.
        """
        root = self.paths.root
        admin = ClusterAdmin(self.client, root, tls=tls)
        if admin.cluster.exists():
            params = admin.cluster.params()
            if not resuming:
                raise ConfigurationError(
                    f"a cluster ({params.name!r}) already exists under {root} on ZooKeeper "
                    f"{self._connect_string}: pass another root, or delete it with "
                    f"`waltz cluster delete --zookeeper {self._connect_string} --root {root}`"
                )
            if params.num_partitions != partitions:
                raise ConfigurationError(
                    f"the cluster under {root} has {params.num_partitions} partitions, not {partitions}"
                )
            self._owns_root = True
            return str(params.cluster_key)
        self._owns_root = True  # from here on, whatever is under the root is this cluster's
        specs = [StorageSpec(connect_string, n.admin_port) for connect_string, n in storages.items()]
        result = admin.create(name, partitions, specs, replicas, credentials=credentials)
        failures = [(s.spec, s.error) for s in result.storage if s.error is not None]
        if failures:
            details = "\n".join(
                f"{spec.connect_string}: {error}\n"
                f"{storages[spec.connect_string].process.log_tail(LOG_TAIL_LINES)}"
                for spec, error in failures
            )
            hint = (
                " (its directory belongs to an earlier cluster: use another work directory)"
                if resuming
                else ""
            )
            raise ServiceStartError(f"storage node(s) refused the new cluster{hint}:\n{details}")
        return str(result.params.cluster_key)

    def close_above_root(self, credentials: RoleCredentials) -> None:
        """On a ZooKeeper of the cluster's own, let anyone only read ``/`` and the root's parents
        (:meth:`ClusterZk.close_above_root <waltz.metadata.zk.ClusterZk.close_above_root>`)."""
        changed = ClusterZk(self.client, self.paths.root).close_above_root(credentials.identities())
        if changed:
            log.info("ZooKeeper's %s: read-only to anyone, the operator role does all", ", ".join(changed))

    def owner(self, partition_id: int) -> str | None:
        """``host:port`` of the server the assignment places ``partition_id`` on, or None.

        Raises:
            RuntimeError: not connected.
        """
        assignment, _ = read_assignment(self.client, self.paths)
        placement = assignment.placements.get(partition_id)
        return placement.endpoint if placement is not None else None

    def owned_partitions(self) -> dict[str, list[int]]:
        """The partitions each server owns, by endpoint; empty when ZooKeeper cannot tell."""
        if self._zk is None or self._paths is None or not self._zk.connected:
            return {}
        try:
            assignment, _ = read_assignment(self._zk, self._paths)
        except Exception as exc:  # a description must not fail because ZooKeeper is down
            log.debug("cannot read the assignment for describe(): %r", exc)
            return {}
        owned: dict[str, list[int]] = {}
        for pid, placement in sorted(assignment.placements.items()):
            if placement.endpoint is not None:
                owned.setdefault(placement.endpoint, []).append(pid)
        return owned

    def replica_placement(self) -> Mapping[str, Sequence[int]] | None:
        """The partitions each storage node holds replicas of, by connect string; None when the
        cluster is not created yet or ZooKeeper cannot tell."""
        if self._zk is None or self._paths is None or not self._zk.connected:
            return None
        try:
            return ClusterZk(self._zk, self._paths.root).assignments().value.replicas
        except Exception as exc:  # not created yet, or ZooKeeper down
            log.debug("cannot read the replica assignments for describe(): %r", exc)
            return None

    def close(self) -> None:
        """Delete the cluster's root when asked to, and close the session. Idempotent."""
        client, self._zk = self._zk, None
        if client is None:
            return
        root = self._paths.root if self._paths is not None else None
        try:
            if self._delete_root and self._owns_root and root is not None and client.connected:
                with contextlib.suppress(NoNodeError):  # the start failed before creating it
                    client.delete(root, recursive=True)
        except Exception:
            log.exception("could not delete %s from ZooKeeper %s", root, self._connect_string)
        finally:
            client.stop()
            client.close()
