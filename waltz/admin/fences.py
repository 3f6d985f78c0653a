"""``waltz cluster storage set-fence``: read and set a partition's fence on a storage node.

Design: docs/design/storage.md "Fencing by store session ID", "Admin port". A storage node fences
every store session below the highest session ID a partition has taken (its fence). A forged or
corrupt session ID within ``storage.fence.maxJump`` can still raise it above ZooKeeper's store
session ID of the partition, and then every new session the server takes is refused until
ZooKeeper's counter passes it. This module compares the node's fence with ZooKeeper's, and sets
it back through the node's admin port, which logs an audit line.

Setting the fence to ZooKeeper's store session ID of the partition is always safe: that session
(the current or last one) is the only one allowed to write. Below it, an older session (a paused
server that lost the partition) could write again; above it, the current session is fenced on
that node and the server takes new sessions until it passes the value. Both are refused unless
forced.
"""

from __future__ import annotations

import getpass
import logging
import socket
from dataclasses import dataclass

from waltz.admin.description import unknown_partitions
from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT, run_admin
from waltz.errors import MetadataError
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig
from waltz.protocol.storage_client import StorageAdminClient

__all__ = [
    "FenceChange",
    "FenceState",
    "check_partition_id",
    "fence_refusals",
    "operator_name",
    "read_fence",
    "set_fence",
    "storage_admin_address",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FenceState:
    """A partition's fence on one storage node, beside ZooKeeper's store session ID.

    Attributes:
        storage: the node's connect string.
        partition_id: the partition.
        fence: the node's fence (the highest store session ID it has taken; -1: none).
        last_session_id: the session of the node's last session info (the last low-water mark).
        zookeeper_session_id: the partition's current (or last) store session ID in ZooKeeper.
    """

    storage: str
    partition_id: int
    fence: int
    last_session_id: int
    zookeeper_session_id: int


@dataclass(frozen=True, slots=True)
class FenceChange:
    """What a storage node did on ``set-fence``.

    Attributes:
        partition_id: the partition.
        previous_fence: the fence before.
        fence: the fence now.
        previous_last_session_id: the last session info's session before.
        last_session_id: and now (lowered with the fence when it was above the new value).
    """

    partition_id: int
    previous_fence: int
    fence: int
    previous_last_session_id: int
    last_session_id: int


def operator_name() -> str:
    """Who runs the command, for the node's audit line: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown-user"
    return f"{user}@{socket.gethostname()}"


def storage_admin_address(cluster: ClusterZk, storage: str) -> str:
    """The admin address of a storage node of the cluster (``store/connection``).

    Raises:
        MetadataError: the node is not in the cluster (no admin port on record).
    """
    connection = cluster.connection().value
    if storage not in connection.admin_ports:
        raise MetadataError(
            f"storage node {storage} is not in the cluster under {cluster.paths.root} (no admin port "
            f"in store/connection): add it with waltz cluster storage add {storage} --admin-port PORT"
        )
    return connection.admin_address(storage)


def check_partition_id(cluster: ClusterZk, partition_id: int) -> None:
    """Check that ``partition_id`` is a partition of the cluster: one of the count at creation,
    or a new partition of a split once opened (docs/design/splits.md "The handover", step 4).

    Raises:
        MetadataError: it is not.
    """
    problem = unknown_partitions(cluster, cluster.params(), [partition_id])
    if problem is not None:
        raise MetadataError(problem)


def read_fence(
    cluster: ClusterZk,
    storage: str,
    partition_id: int,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> FenceState:
    """Read a partition's fence on a storage node (admin port) and its session ID in ZooKeeper.

    Raises:
        MetadataError: the node or the partition is not in the cluster.
        StorageUnreachableError, StorageRpcError: the node did not answer or refused
            (``PARTITION_NOT_ASSIGNED`` when it does not hold the partition).
    """
    check_partition_id(cluster, partition_id)
    address = storage_admin_address(cluster, storage)
    zookeeper_session_id = cluster.partition_metadata(partition_id).value.session_id

    async def status(admin: StorageAdminClient) -> tuple[int, int]:
        (partition,) = (await admin.partition_status(partition_id)).partitions
        return partition.session_id, partition.last_session_id

    fence, last_session_id = run_admin(
        address, cluster.params(), status, timeout=timeout, tls=tls, initialise=False
    )
    return FenceState(storage, partition_id, fence, last_session_id, zookeeper_session_id)


def fence_refusals(state: FenceState, session_id: int) -> list[str]:
    """Why setting the fence of ``state`` to ``session_id`` is unsafe (empty: it is safe).

    Args:
        state: the fence as read by :func:`read_fence`.
        session_id: the new fence.

    Returns:
        One sentence per reason: below ZooKeeper's store session ID an older session could write
        again; above it the current session is fenced on the node.
    """
    current = state.zookeeper_session_id
    where = f"partition {state.partition_id} on {state.storage}"
    if session_id < current:
        return [
            f"{where}: {session_id} is below ZooKeeper's store session ID {current}: a server still "
            f"holding an older session (up to {current - 1}) could write to this replica again"
        ]
    if session_id > current:
        return [
            f"{where}: {session_id} is above ZooKeeper's store session ID {current}: the current "
            f"session would be fenced on this node, and the server would take new sessions until "
            f"it passes {session_id}"
        ]
    return []


def set_fence(
    cluster: ClusterZk,
    storage: str,
    partition_id: int,
    session_id: int,
    *,
    reason: str = "",
    operator: str | None = None,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
    expected_fence: int | None = None,
) -> FenceChange:
    """Set a partition's fence on a storage node (admin port); the node logs an audit line.

    The safety check is the caller's (:func:`fence_refusals`): this sets what it is given.

    Args:
        cluster: the cluster's znodes.
        storage: the node's connect string.
        partition_id: the partition.
        session_id: the new fence, at least -1.
        reason: why, for the audit line.
        operator: who, for the audit line (default: :func:`operator_name`).
        timeout: seconds for the node's answer.
        tls: client TLS files for the admin port.
        expected_fence: set it only if the node's fence is still this (the value the caller's
            check was made against); otherwise the node refuses with ``INVALID_REQUEST``.

    Raises:
        MetadataError: the node or the partition is not in the cluster.
        StorageUnreachableError, StorageRpcError: the node did not answer or refused.
    """
    check_partition_id(cluster, partition_id)
    address = storage_admin_address(cluster, storage)
    who = operator_name() if operator is None else operator

    async def change(admin: StorageAdminClient) -> FenceChange:
        answer = await admin.set_fence(
            partition_id, session_id, operator=who, reason=reason, expected_fence=expected_fence
        )
        return FenceChange(
            partition_id,
            answer.previous_fence,
            answer.fence,
            answer.previous_last_session_id,
            answer.last_session_id,
        )

    result = run_admin(address, cluster.params(), change, timeout=timeout, tls=tls, initialise=False)
    log.warning(
        "storage node %s: partition %d fence set %d -> %d by %s: %s",
        storage,
        partition_id,
        result.previous_fence,
        result.fence,
        who,
        reason or "(no reason given)",
    )
    return result
