"""A storage node's partitions as the node itself reports them, and syncing them with ZooKeeper.

Design: docs/design/storage.md "Admin port"; docs/design/zookeeper.md "Replica assignments and
groups". ``waltz storage list`` shows what the node holds (its partition status over the admin
port: its local start and archived-through among them, docs/design/archive.md, "Retention on the
storage nodes") next to what ``store/assignment`` assigns it; ``waltz storage sync-partitions`` creates on
the node the partitions ZooKeeper assigns it but it lacks, and removes from it the partitions it
holds but ZooKeeper does not assign it (their files stay unless asked). ZooKeeper is never
changed here: it is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.description import StorageNodeInfo, describe_cluster
from waltz.admin.storage_nodes import run_admin
from waltz.errors import ConfigurationError
from waltz.protocol import storage_pb2
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["NodePartitions", "SyncPlan", "apply_sync", "node_partitions", "plan_sync"]


@dataclass(frozen=True, slots=True)
class NodePartitions:
    """A storage node's partitions: what it holds (its status) and what ZooKeeper assigns it.

    Attributes:
        storage: the node's connect string.
        admin_address: ``host:admin_port``.
        assigned: partitions ``store/assignment`` gives the node, sorted.
        held: the node's partition states, by partition ID.
    """

    storage: str
    admin_address: str
    assigned: tuple[int, ...]
    held: dict[int, storage_pb2.PartitionStatus]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``waltz storage list --json``)."""
        return {
            "storage": self.storage,
            "admin_address": self.admin_address,
            "assigned": list(self.assigned),
            "partitions": [
                {
                    "partition_id": pid,
                    "assigned_in_zookeeper": pid in self.assigned,
                    "readable": s.readable,
                    "writable": s.writable,
                    "session_id": s.session_id,
                    "low_water_mark": s.low_water_mark,
                    "local_low_water_mark": s.local_low_water_mark,
                    "max_transaction_id": s.max_transaction_id,
                    "corrupt_transaction_id": s.corrupt_transaction_id,
                    "local_start": s.local_start,
                    "archived_through": s.archived_through,
                    "retention_policy": s.retention_policy,
                }
                for pid, s in sorted(self.held.items())
            ],
            "missing": [p for p in self.assigned if p not in self.held],
        }


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What ``sync-partitions`` changes on a node: partitions to create and to remove."""

    storage: str
    create: tuple[int, ...]
    remove: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return not self.create and not self.remove


def _node(admin: ClusterAdmin, storage: str) -> StorageNodeInfo:
    description = describe_cluster(admin.cluster)
    node = description.storage_node(storage)
    if node is None:
        known = ", ".join(n.connect_string for n in description.storage_nodes) or "none"
        raise ConfigurationError(f"storage node {storage} is not in the cluster (known: {known})")
    if node.admin_address is None:
        raise ConfigurationError(f"storage node {storage} has no admin port in store/connection")
    return node


def node_partitions(admin: ClusterAdmin, storage: str) -> NodePartitions:
    """Ask a storage node for its partitions' states over its admin port.

    Args:
        admin: the cluster (ZooKeeper session, storage timeout, TLS).
        storage: the node's connect string ``host:port``.

    Raises:
        ConfigurationError: the node is not in the cluster or has no admin port on record.
        StorageUnreachableError: the node did not answer.
        StorageRpcError: the node refused (e.g. another cluster's node).
    """
    node = _node(admin, storage)
    address = node.admin_address
    assert address is not None

    async def status(client: StorageAdminClient) -> storage_pb2.PartitionStatusResponse:
        return await client.partition_status(-1)

    params = admin.cluster.params()
    response = run_admin(
        address, params, status, timeout=admin.storage_timeout, tls=admin.tls, initialise=False
    )
    return NodePartitions(storage, address, node.partitions, {p.partition_id: p for p in response.partitions})


def plan_sync(partitions: NodePartitions) -> SyncPlan:
    """The partitions to create on the node and to remove from it to match ZooKeeper."""
    held = set(partitions.held)
    assigned = set(partitions.assigned)
    return SyncPlan(partitions.storage, tuple(sorted(assigned - held)), tuple(sorted(held - assigned)))


def apply_sync(
    admin: ClusterAdmin, plan: SyncPlan, admin_address: str, *, delete_storage_files: bool = False
) -> None:
    """Create and remove the plan's partitions on the node (creations first).

    Args:
        admin: the cluster (ZooKeeper session, storage timeout, TLS).
        plan: from :func:`plan_sync`.
        admin_address: the node's ``host:admin_port``.
        delete_storage_files: also delete the removed partitions' files.

    Raises:
        StorageUnreachableError, StorageRpcError: as :func:`node_partitions`.
    """

    async def change(client: StorageAdminClient) -> None:
        for pid in plan.create:
            await client.assign_partition(pid, True)
        for pid in plan.remove:
            await client.assign_partition(pid, False, delete_storage_files=delete_storage_files)

    if not plan.empty:
        run_admin(admin_address, admin.cluster.params(), change, timeout=admin.storage_timeout, tls=admin.tls)
