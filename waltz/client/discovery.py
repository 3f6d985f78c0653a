"""Server discovery through ZooKeeper: the cluster, the client ID, and the partition assignment.

Source: docs/design/client.md "WaltzClient and AsyncWaltzClient" (the client connects to
ZooKeeper when created), "ReqId and identities" (the client ID's uniqueness is guaranteed by
ZooKeeper), "Discovery through ZooKeeper" (the assignment's generations); ``docs/protocol.md``
"Connections and identities". Znodes read (``docs/zookeeper.md``):

- ``<root>/discovery``: the number of partitions (``<root>/cluster`` in a cluster made before
  ``discovery`` existed; clients of a cluster made with role credentials may not read ``cluster``,
  which holds the cluster key);
- ``<root>/client/ids``: in a cluster made with role credentials, each client creates an
  ephemeral sequential znode there and takes its ID from its sequence number;
- ``<root>/client/id``: a kazoo ``Counter``; elsewhere each client takes the next value as its ID;
- ``<root>/server/assignment``: partition -> server endpoint and generation, watched;
- ``<root>/partitions/epochs``: the partition epochs of the cluster's splits, watched
  (docs/design/splits.md "Clients across a split"; absent in a cluster that never split).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.counter import Counter

from waltz.errors import MetadataError
from waltz.metadata.assignment import PartitionAssignment, read_assignment
from waltz.metadata.epochs import PartitionEpochs
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.metadata.zk_roles import ClusterRoles
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import connect_zookeeper, zookeeper_access

__all__ = ["ServerDiscovery", "client_id_path"]

log = logging.getLogger(__name__)

_INT32_MAX = (1 << 31) - 1


def client_id_path(paths: ClusterPaths) -> str:
    """The znode of the client ID counter, ``<root>/client/id``."""
    return f"{paths.root}/client/id"


class ServerDiscovery:
    """A ZooKeeper session that finds the servers of a cluster for a client.

    Args:
        connect_string: the ZooKeeper connect string.
        root: the cluster root znode.
        session_timeout: the ZooKeeper session timeout in seconds.
        connect_timeout: seconds to wait for the first connection.
        security: the cluster's ZooKeeper credential and TLS (docs/design/zookeeper.md,
            "Security"); None: no authentication, plaintext.

    Raises:
        ZooKeeperUnavailableError: ZooKeeper did not answer in time.
        ZooKeeperAuthError: the cluster's znodes refuse this session's credential (or its lack).
        ClusterNotFoundError: no cluster under ``root``.
        ZnodeAclError: the cluster's root or a child of it lets in anyone or an unknown identity
            while this session holds a credential (docs/design/zookeeper.md, "Checking the root").
        ConfigurationError: the connect string is malformed.
    """

    def __init__(
        self,
        connect_string: str,
        root: str,
        *,
        session_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        security: ZooKeeperSecurity | None = None,
    ) -> None:
        self.paths = ClusterPaths.of(root)
        self._zk: KazooClient = connect_zookeeper(
            connect_string,
            connect_timeout=connect_timeout,
            session_timeout=session_timeout,
            security=security,
        )
        self._closed = False
        self._watching = False
        self._lock = threading.Lock()
        try:
            cluster = ClusterZk(self._zk, self.paths.root)
            cluster.check_security()
            self.num_partitions = cluster.discovery().num_partitions
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def next_client_id(self) -> int:
        """Take a new client ID, unique in the cluster (docs/design/zookeeper.md, "Client IDs").

        In a cluster made with role credentials, by creating an ephemeral sequential znode under
        ``<root>/client/ids``: the ID is the counter's last ID (the data of ``client/ids``) plus
        the znode's sequence number plus 1. Clients may create there but never write or delete,
        so none can hand out an ID twice. Elsewhere, by incrementing the ``<root>/client/id``
        counter (1, 2, 3, ...).

        Raises:
            MetadataError: the ID passed the 32-bit range of a ReqId's client ID, ``client/ids``
                does not hold a number, or no sequential znode could be made in 100 tries.
        """
        ids = self.paths.client_ids
        with zookeeper_access(self._zk, f"taking a client ID under {ids}"):
            try:
                counted, _ = self._zk.get(ids)
            except NoNodeError:
                return self._counter_client_id()
            roles_data, _ = self._zk.get(self.paths.roles)
            acl = ClusterRoles.decode(roles_data, self.paths.roles).acl_for("client/ids/id-")
            for _ in range(100):  # a name taken already (made by hand): the next sequence number
                try:
                    created: str = self._zk.create(f"{ids}/id-", b"", acl=acl, ephemeral=True, sequence=True)
                    break
                except NodeExistsError:
                    continue
            else:
                raise MetadataError(f"no client ID znode could be made under {ids} in 100 tries")
        try:
            value = int(counted.decode("ascii") or "0") + int(created.rsplit("-", 1)[1]) + 1
        except ValueError:
            raise MetadataError(
                f"{ids} holds {counted!r}, not the last ID of the client ID counter"
            ) from None
        return self._checked(value, ids)

    def _counter_client_id(self) -> int:
        counter = Counter(self._zk, client_id_path(self.paths))
        with zookeeper_access(self._zk, f"taking a client ID from {client_id_path(self.paths)}"):
            counter += 1
        return self._checked(counter.post_value, client_id_path(self.paths))

    @staticmethod
    def _checked(value: object, source: str) -> int:
        if not isinstance(value, int) or not 0 < value <= _INT32_MAX:
            raise MetadataError(f"client ID from {source} is {value!r}, outside 1..{_INT32_MAX}")
        return value

    def read_assignment(self) -> PartitionAssignment:
        """The partition assignment now (empty when the cluster manager has not written one)."""
        with zookeeper_access(self._zk, f"reading {self.paths.server_assignment}"):
            assignment, _ = read_assignment(self._zk, self.paths)
        return assignment

    def watch_assignment(self, on_change: Callable[[PartitionAssignment], None]) -> None:
        """Call ``on_change`` (on a kazoo thread) with the assignment now and after every change.

        A malformed assignment is logged and skipped (the previous one stays in force).
        """
        with self._lock:
            if self._watching:
                raise RuntimeError("the assignment is already watched")
            self._watching = True

        def changed(data: bytes | None, stat: object, event: object = None) -> bool:
            if self._closed:
                return False
            if not data:
                on_change(PartitionAssignment())
                return True
            try:
                assignment = PartitionAssignment.decode(data, self.paths.server_assignment)
            except MetadataError:
                log.exception("cannot read the partition assignment; keeping the previous one")
                return True
            on_change(assignment)
            return True

        self._zk.DataWatch(self.paths.server_assignment, changed)

    def watch_epochs(self, on_change: Callable[[PartitionEpochs, int], None]) -> None:
        """Call ``on_change(epochs, version)`` with ``<root>/partitions/epochs`` now (before this
        returns) and after every change, in the znode's order (on a kazoo thread; the watch is set
        again across reconnections and session losses).

        Without the znode (a cluster that never split) ``epochs`` holds no epoch and the count of
        ``discovery``, and ``version`` is -1 (as ``PartitionEpochsZk.read`` answers; docs/design/
        splits.md "The epochs znode's record form"). A znode that does not decode is logged and
        skipped: the previous value stays in force.

        Raises:
            ZooKeeperAuthError: the session may not read the znode.
            ZooKeeperUnavailableError: ZooKeeper did not answer.
        """
        path = self.paths.epochs

        def changed(data: bytes | None, stat: object, event: object = None) -> bool:
            if self._closed:
                return False
            if stat is None:
                on_change(PartitionEpochs(self.num_partitions), -1)
                return True
            try:
                epochs = PartitionEpochs.decode(data or b"", path)
            except MetadataError:
                log.exception("cannot read the partition epochs; keeping the previous ones")
                return True
            on_change(epochs, int(getattr(stat, "version", 0)))
            return True

        with zookeeper_access(self._zk, f"watching {path}"):
            self._zk.DataWatch(path, changed)

    def close(self) -> None:
        """Stop watching and close the ZooKeeper session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._zk.stop()
            self._zk.close()
        except Exception:
            log.exception("closing the ZooKeeper session failed")
