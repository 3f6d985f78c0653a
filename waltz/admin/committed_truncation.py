"""``waltz cluster storage truncate-committed``: remove committed transactions on purpose.

Design: docs/design/storage.md, "The committed floor". A storage node refuses every store
session's truncation below a partition's low-water mark, since everything up to it is committed.
An operator who must remove committed transactions anyway (a poison transaction, a corrupt
committed record) asks each node through its admin port; the node allows it to a peer with the
``admin`` role over mutual TLS only, lowers the partition's low-water mark with it, and logs an
audit line with the peer's certificate subject. The procedure is in docs/operations.md,
"Truncating committed transactions".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from waltz.admin.fences import check_partition_id, operator_name, storage_admin_address
from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT, run_admin
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["CommittedTruncationResult", "ReplicaLog", "read_replica_log", "truncate_committed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaLog:
    """Where a partition's log ends on one storage node, and its committed floor.

    Attributes:
        storage: the node's connect string.
        partition_id: the partition.
        max_transaction_id: the highest transaction stored (-1: none).
        low_water_mark: the partition's low-water mark: every transaction up to it is committed.
        local_start: the first transaction held on the node's disk.
    """

    storage: str
    partition_id: int
    max_transaction_id: int
    low_water_mark: int
    local_start: int

    @property
    def committed_floor(self) -> int:
        """The lowest transaction a store session may truncate to on this node."""
        return min(self.low_water_mark, self.max_transaction_id)


@dataclass(frozen=True, slots=True)
class CommittedTruncationResult:
    """What a storage node did on ``truncate-committed``.

    Attributes:
        partition_id: the partition.
        previous_max_transaction_id: the highest transaction stored before.
        max_transaction_id: and now.
        previous_low_water_mark: the low-water mark before.
        low_water_mark: and now.
    """

    partition_id: int
    previous_max_transaction_id: int
    max_transaction_id: int
    previous_low_water_mark: int
    low_water_mark: int


def read_replica_log(
    cluster: ClusterZk,
    storage: str,
    partition_id: int,
    *,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> ReplicaLog:
    """Read a partition's max transaction ID, low-water mark and local start on a storage node.

    Raises:
        MetadataError: the node or the partition is not in the cluster.
        StorageUnreachableError, StorageRpcError: the node did not answer or refused.
    """
    check_partition_id(cluster, partition_id)
    address = storage_admin_address(cluster, storage)

    async def status(admin: StorageAdminClient) -> ReplicaLog:
        (partition,) = (await admin.partition_status(partition_id)).partitions
        return ReplicaLog(
            storage,
            partition_id,
            partition.max_transaction_id,
            partition.low_water_mark,
            partition.local_start,
        )

    return run_admin(address, cluster.params(), status, timeout=timeout, tls=tls, initialise=False)


def truncate_committed(
    cluster: ClusterZk,
    storage: str,
    partition_id: int,
    transaction_id: int,
    *,
    reason: str = "",
    operator: str | None = None,
    timeout: float = DEFAULT_STORAGE_TIMEOUT,
    tls: TlsConfig | None = None,
) -> CommittedTruncationResult:
    """Truncate a partition on a storage node to ``transaction_id``, below its committed
    transactions if need be (admin port); the node logs an audit line.

    Args:
        cluster: the cluster's znodes.
        storage: the node's connect string.
        partition_id: the partition.
        transaction_id: the last transaction kept (-1: none).
        reason: why, for the audit line.
        operator: who, for the audit line (default: :func:`~waltz.admin.fences.operator_name`).
        timeout: seconds for the node's answer.
        tls: client TLS files: an ``admin`` certificate (the node refuses anything else).

    Raises:
        MetadataError: the node or the partition is not in the cluster.
        StorageAccessDeniedError: no ``admin`` certificate over mutual TLS.
        StorageUnreachableError, StorageRpcError: the node did not answer or refused
            (``INVALID_REQUEST`` below its local start - 1).
    """
    check_partition_id(cluster, partition_id)
    address = storage_admin_address(cluster, storage)
    who = operator_name() if operator is None else operator

    async def truncate(admin: StorageAdminClient) -> CommittedTruncationResult:
        answer = await admin.truncate_below_committed(
            partition_id, transaction_id, operator=who, reason=reason
        )
        return CommittedTruncationResult(
            partition_id,
            answer.previous_max_transaction_id,
            answer.max_transaction_id,
            answer.previous_low_water_mark,
            answer.low_water_mark,
        )

    result = run_admin(address, cluster.params(), truncate, timeout=timeout, tls=tls, initialise=False)
    log.warning(
        "storage node %s: partition %d truncated from transaction %d to %d (low-water mark %d -> %d) "
        "by %s: %s",
        storage,
        partition_id,
        result.previous_max_transaction_id,
        result.max_transaction_id,
        result.previous_low_water_mark,
        result.low_water_mark,
        who,
        reason or "(no reason given)",
    )
    return result
