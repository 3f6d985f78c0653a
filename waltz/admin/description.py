"""A snapshot of one cluster's metadata in ZooKeeper, as ``waltz cluster list`` shows it.

Design: docs/design/zookeeper.md "Partition metadata", "Replica assignments and groups".
:func:`describe_cluster` reads every znode of the cluster once (not atomically: each znode is
consistent, the set may straddle a concurrent change) and joins them per storage node and per
partition. The partitions are those that exist: the count at creation and every child a split
opened (docs/design/splits.md "What ZooKeeper holds").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from waltz.errors import ClusterNotFoundError, MetadataError
from waltz.metadata.epochs import PartitionEpochsZk
from waltz.metadata.values import ClusterParams, PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk
from waltz.protocol.cluster_key import cluster_key_fingerprint

__all__ = ["ClusterDescription", "PartitionInfo", "StorageNodeInfo", "describe_cluster", "replica_states"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StorageNodeInfo:
    """One storage node as ZooKeeper knows it.

    Attributes:
        connect_string: ``host:port`` of its storage port (its name in every znode).
        admin_port: its admin port (``store/connection``), or None when missing.
        group: its replica group (``store/group``), or None when missing.
        partitions: the partitions assigned to it (``store/assignment``), sorted.
    """

    connect_string: str
    admin_port: int | None
    group: int | None
    partitions: tuple[int, ...]

    @property
    def admin_address(self) -> str | None:
        """``host:admin_port``, or None when the admin port is not on record."""
        if self.admin_port is None:
            return None
        return f"{self.connect_string.rpartition(':')[0]}:{self.admin_port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition: its metadata (``store/partition/<id>``) and its assigned replicas.

    Attributes:
        partition_id: the partition.
        metadata: generation, store session ID and replica states, or None when the znode is
            missing or does not decode.
        assigned: connect strings of the storage nodes assigned a replica, sorted.
        error: why ``metadata`` is None, or None.
    """

    partition_id: int
    metadata: PartitionMetadata | None
    assigned: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """Everything ZooKeeper holds about a cluster's storage, joined.

    Attributes:
        root: the cluster root znode.
        params: name, number of partitions, cluster key.
        storage_nodes: every storage node named in the assignment, group or connection znode,
            sorted by connect string.
        partitions: the partitions that exist, in order: ``0 .. num_partitions - 1`` (the count at
            creation) and every new child a split opened (``PartitionEpochs.partition_ids``).
    """

    root: str
    params: ClusterParams
    storage_nodes: tuple[StorageNodeInfo, ...]
    partitions: tuple[PartitionInfo, ...]

    def storage_node(self, connect_string: str) -> StorageNodeInfo | None:
        """The storage node with this connect string, or None."""
        for node in self.storage_nodes:
            if node.connect_string == connect_string:
                return node
        return None

    def to_json(self, *, show_key: bool = False) -> dict[str, Any]:
        """A JSON-ready dict (``waltz cluster list --json``); unresolved marks are ``null``.

        The cluster key is there by its fingerprint (``cluster_key_fingerprint``); the key itself
        (``cluster_key``) only with ``show_key`` (docs/design/overview.md, "The cluster key").
        """
        key = {"cluster_key": str(self.params.cluster_key)} if show_key else {}
        return {
            "root": self.root,
            "name": self.params.name,
            "num_partitions": self.params.num_partitions,
            "partition_count": len(self.partitions),
            "cluster_key_fingerprint": cluster_key_fingerprint(self.params.cluster_key),
            **key,
            "storage_nodes": [
                {
                    "connect_string": n.connect_string,
                    "admin_port": n.admin_port,
                    "group": n.group,
                    "partitions": list(n.partitions),
                }
                for n in self.storage_nodes
            ],
            "partitions": [
                {
                    "partition_id": p.partition_id,
                    "assigned": list(p.assigned),
                    "generation": None if p.metadata is None else p.metadata.generation,
                    "session_id": None if p.metadata is None else p.metadata.session_id,
                    "replicas": {}
                    if p.metadata is None
                    else {
                        storage: {
                            "session_id": state.session_id,
                            "closing_high_water_mark": state.closing_high_water_mark,
                        }
                        for storage, state in sorted(p.metadata.replicas.items())
                    },
                }
                for p in self.partitions
            ],
        }


def replica_states(partition: PartitionInfo) -> Mapping[str, ReplicaState]:
    """The partition's replica states (empty when its metadata znode is missing)."""
    return {} if partition.metadata is None else partition.metadata.replicas


def describe_cluster(zk: ClusterZk) -> ClusterDescription:
    """Read a cluster's storage metadata from ZooKeeper.

    Args:
        zk: the cluster's znodes.

    Returns:
        The joined snapshot. A missing or malformed ``store/partition/<id>`` znode gives
        ``metadata=None`` and an ``error`` (``waltz cluster verify`` reports it) instead of an
        exception.

    Raises:
        ClusterNotFoundError: no cluster exists under the root.
        MetadataError: the cluster, assignment, group or connection znode is missing or does not
            decode.
    """
    params = zk.params()
    assignments = zk.assignments().value
    groups = zk.groups().value
    connection = zk.connection().value
    names = sorted(set(assignments.replicas) | set(groups.groups) | set(connection.admin_ports))
    nodes = tuple(
        StorageNodeInfo(
            connect_string=name,
            admin_port=connection.admin_ports.get(name),
            group=groups.groups.get(name),
            partitions=tuple(sorted(assignments.replicas.get(name, ()))),
        )
        for name in names
    )
    partitions = []
    for partition_id in partition_ids(zk, params):
        assigned = tuple(assignments.storages_of(partition_id))
        try:
            metadata = zk.partition_metadata(partition_id).value
        except ClusterNotFoundError:
            raise
        except MetadataError as exc:
            partitions.append(PartitionInfo(partition_id, None, assigned, str(exc)))
            continue
        partitions.append(PartitionInfo(partition_id, metadata, assigned))
    return ClusterDescription(zk.paths.root, params, nodes, tuple(partitions))


def partition_ids(zk: ClusterZk, params: ClusterParams) -> tuple[int, ...]:
    """The partitions that exist (``PartitionEpochs.partition_ids``); those of the count at creation
    when ``partitions/epochs`` does not decode (logged: ``waltz cluster verify`` then names the
    children's replicas as unknown partitions)."""
    try:
        return PartitionEpochsZk(zk.zk, zk.paths, timeout=zk.timeout).read().value.partition_ids
    except ClusterNotFoundError:
        raise
    except MetadataError as exc:
        log.warning("describing the partitions at creation only: %s", exc)
        return tuple(range(params.num_partitions))


def opened_partitions(zk: ClusterZk, params: ClusterParams) -> tuple[int, ...]:
    """The partitions splits opened: :func:`partition_ids` above the count at creation."""
    return partition_ids(zk, params)[params.num_partitions :]


def unknown_partitions(zk: ClusterZk, params: ClusterParams, ids: Iterable[int]) -> str | None:
    """Why some of ``ids`` are not partitions of the cluster (those at creation, and a split's
    new ones once opened: :func:`partition_ids`), as one sentence for an error; None when all are.
    """
    existing = partition_ids(zk, params)
    bad = sorted(set(ids) - set(existing))
    if not bad:
        return None
    opened = existing[params.num_partitions :]  # opened_partitions, from the same read
    split = f" and, opened by a split, {', '.join(map(str, opened))}" if opened else ""
    which = f"partition {bad[0]} does not exist" if len(bad) == 1 else f"partitions {bad} do not exist"
    return f"{which}: the cluster has partitions 0..{params.num_partitions - 1}{split}"
