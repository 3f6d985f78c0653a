"""Step 4 of a split, "Open": what opening a new child needs, and whether this cluster can do it.

Design: docs/design/splits.md "The handover" (step 4: a new child opens once its own parent has
``B(p)``; its replicas go on its parent's storage nodes as a log that starts at ``B(p) + 1``, its
``store/partition/<id>`` has each replica closed at ``B(p)``), "Terms" (parent, child, barrier,
genesis); docs/design/archive.md "Restoring a cluster from the archive" (how a partition is made
to start at a later transaction ID); docs/design/zookeeper.md "Partition metadata".

:func:`plan_child_open` reads the epochs znode, ``store/assignment`` and the cluster's parameters
and returns the :class:`ChildOpenPlan` (the start, the storage nodes, the partition metadata), or
refuses. Carrying the plan out is not built: a storage node's control file is made for the
partition count the cluster was created with and refuses every partition at or above it (its
admin open also refuses any other count), and the servers open store sessions, and the cluster
manager assigns partitions, by that same count. Until a node's count can grow, every new child is
refused with :class:`ChildBeyondStorageError`, before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from waltz.errors import MetadataError, SplitStateError
from waltz.metadata.epochs import PartitionEpochsZk
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk

__all__ = ["ChildBeyondStorageError", "ChildOpenPlan", "plan_child_open"]


class ChildBeyondStorageError(SplitStateError):
    """A new child's number is at or above the partition count the storage nodes were made for.

    Attributes:
        child: the new child.
        storage_count: the count the cluster was created with, which each storage node's control
            file holds (partitions ``0 .. storage_count - 1``).
    """

    def __init__(self, child: int, storage_count: int) -> None:
        super().__init__(
            f"child {child} cannot be opened: the storage nodes hold partitions 0..{storage_count - 1} "
            f"only (their control files are made for the {storage_count} partitions the cluster was "
            "created with), and growing a node's partition count is not built; nothing was written"
        )
        self.child = child
        self.storage_count = storage_count


@dataclass(frozen=True, slots=True)
class ChildOpenPlan:
    """What opening a new child writes (docs/design/splits.md "The handover", step 4).

    Attributes:
        epoch: the epoch the child belongs to (``n+1``).
        child: the new child.
        parent: its parent, ``child mod C(n)``.
        barrier: the parent's ``B(p)``.
        storages: the parent's storage nodes (connect strings, sorted): each gets a replica of the
            child.
        opened: the child is marked opened already (its replicas and metadata exist).
        genesis: the child's genesis ID in the znode (None until its owner wrote it).
    """

    epoch: int
    child: int
    parent: int
    barrier: int
    storages: tuple[str, ...]
    opened: bool
    genesis: int | None

    @property
    def start(self) -> int:
        """The first transaction ID of the child's log, ``B(p) + 1``: its genesis's."""
        return self.barrier + 1

    @property
    def metadata(self) -> PartitionMetadata:
        """The child's first ``store/partition/<child>``: no session yet, and each replica closed
        at ``B(p)``, so that its first owner's recovery finds an empty log whose high-water mark
        is ``B(p)`` (as a restored cluster's partitions start, docs/design/archive.md, "Restoring a
        cluster from the archive")."""
        return PartitionMetadata(0, -1, {s: ReplicaState(-1, self.barrier) for s in self.storages})


def plan_child_open(cluster: ClusterZk, epoch: int, child: int) -> ChildOpenPlan:
    """The plan of step 4 for ``child`` of ``epoch``, read from ZooKeeper; writes nothing.

    Args:
        cluster: the cluster's znodes (a session that may read ``partitions/epochs``,
            ``cluster`` and ``store/assignment``).
        epoch: the epoch (1 or more).
        child: a new child of the epoch (``C(n) <= child < C(n+1)``).

    Returns:
        The plan.

    Raises:
        SplitStateError: there is no such epoch, ``child`` is not one of its new children, or its
            parent has no ``B(p)`` in the znode yet (docs/design/splits.md "The epochs znode's
            record form": a child opens only after its parent's barrier).
        ChildBeyondStorageError: (a SplitStateError) the storage nodes cannot hold ``child``
            (module docstring).
        MetadataError: the parent has no replica in ``store/assignment``, or a znode does not
            decode.
        ClusterNotFoundError, ZooKeeperUnavailableError: as the reads of :class:`ClusterZk`.
    """
    value = PartitionEpochsZk(cluster.zk, cluster.paths, timeout=cluster.timeout).read().value
    split = value.epoch(epoch)
    parent, barrier = split.parent_barrier(child)
    if barrier is None:
        raise SplitStateError(
            f"epoch {epoch}: child {child} opens after its parent {parent}'s barrier, which is not "
            "known yet (the parent must be sealed first); nothing was written"
        )
    storage_count = cluster.params().num_partitions
    if child >= storage_count:
        raise ChildBeyondStorageError(child, storage_count)
    storages = tuple(cluster.assignments().value.storages_of(parent))
    if not storages:
        raise MetadataError(f"parent {parent} has no replica in store/assignment: child {child} has no node")
    progress = split.children[child]
    return ChildOpenPlan(epoch, child, parent, barrier, storages, progress.opened, progress.genesis)
