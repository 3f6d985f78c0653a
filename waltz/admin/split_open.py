"""Step 4 of a split, "Open": a new child's replicas, its partition metadata, and its opened mark.

Design: docs/design/splits.md "The handover" (step 4: a new child opens once its own parent has
``B(p)``; its replicas go on its parent's storage nodes as a log that starts at ``B(p) + 1``, its
``store/partition/<id>`` has each replica closed at ``B(p)``), "Terms" (parent, child, barrier,
genesis); docs/design/storage.md "Partition count" (a node grows to the epoch's count and still
takes opens with the count at creation); docs/design/archive.md "Restoring a cluster from the
archive" (how a partition is made to start at a later transaction ID); docs/design/zookeeper.md
"Partition metadata".

:func:`plan_child_open` reads the epochs znode and ``store/assignment``
and returns the :class:`ChildOpenPlan` (the start, the storage nodes, the partition metadata), or
refuses, writing nothing. :func:`open_child` carries the plan out, in an order that a run stopped
anywhere can finish by running again, and that changes nothing once done:

1. on each of the parent's storage nodes (all at once; every node must answer): grow the node to
   the epoch's count, then create the child's replica as an empty log starting at ``B(p) + 1``
   (a repeated creation of that same empty log is answered as the first was);
2. ``store/assignment``: the child's replica on each of those nodes (compare-and-set);
3. ``store/partition/<child>``: created with each replica closed at ``B(p)``, no session;
4. ``partitions/epochs``: the child marked opened. From then on the cluster manager places it on
   a server, whose recovery finds an empty log whose high-water mark is ``B(p)``; until its
   genesis it refuses appends with ``PARTITION_NOT_OPEN``.

Nothing reaches ZooKeeper while a node is missing (step 1 raises first), so ZooKeeper never names
a replica that was not made.

Error handling: :class:`~waltz.errors.ParentNotSealedError` (no ``B(p)`` yet: the parent is not
sealing, or its owner has not written ``B(p)``) and other :class:`~waltz.errors.SplitStateError`
(no such epoch or child) before anything is written; :class:`~waltz.errors.SplitStorageError` when
a storage node did not answer or refused step 1 (nothing in ZooKeeper written; the nodes that
answered are grown and hold the empty replica, which the next run takes as it is);
:class:`~waltz.errors.StaleMetadataError` when a znode kept changing under a compare-and-set.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from waltz.admin.storage_nodes import DEFAULT_STORAGE_TIMEOUT, call_admin_on_nodes
from waltz.errors import MetadataError, ParentNotSealedError, SplitStorageError, StaleMetadataError
from waltz.metadata.epochs import MAX_CAS_ATTEMPTS, Epoch, PartitionEpochsZk
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk
from waltz.protocol.channels import TlsConfig
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.storage_client import StorageAdminClient

__all__ = ["ChildOpenPlan", "open_child", "plan_child_open"]

log = logging.getLogger(__name__)


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
        ParentNotSealedError: (a SplitStateError) the parent has no ``B(p)`` in the znode yet
            (docs/design/splits.md "The epochs znode's record form": a child opens only after its
            parent's barrier).
        SplitStateError: there is no such epoch, or ``child`` is not one of its new children.
        MetadataError: the parent has no replica in ``store/assignment``, or a znode does not
            decode.
        ClusterNotFoundError, ZooKeeperUnavailableError: as the reads of :class:`ClusterZk`.
    """
    value = PartitionEpochsZk(cluster.zk, cluster.paths, timeout=cluster.timeout).read().value
    return _plan(cluster, value.epoch(epoch), child)


def _plan(cluster: ClusterZk, split: Epoch, child: int) -> ChildOpenPlan:
    parent, barrier = split.parent_barrier(child)
    if barrier is None:
        raise ParentNotSealedError(split.number, child, parent, split.parents[parent].sealing)
    storages = tuple(cluster.assignments().value.storages_of(parent))
    if not storages:
        raise MetadataError(f"parent {parent} has no replica in store/assignment: child {child} has no node")
    progress = split.children[child]
    return ChildOpenPlan(split.number, child, parent, barrier, storages, progress.opened, progress.genesis)


def open_child(
    cluster: ClusterZk,
    epoch: int,
    child: int,
    *,
    tls: TlsConfig | None = None,
    storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
    operator: str = "",
) -> ChildOpenPlan:
    """Carry out step 4 for ``child`` of ``epoch`` (module docstring): grow its parent's storage
    nodes to the epoch's count, make its replicas there as logs starting at ``B(p) + 1``, add them
    to ``store/assignment``, create ``store/partition/<child>`` with each replica closed at
    ``B(p)``, and mark the child opened.

    Repeatable: a run stopped at any point is finished by the next; a child marked opened already
    is returned as it is, with nothing written.

    Args:
        cluster: the cluster's znodes, on a session of the operator (it writes ``store/assignment``,
            ``store/partition/<child>`` and ``partitions/epochs``).
        epoch: the epoch (1 or more).
        child: a new child of the epoch.
        tls: client TLS files for the storage nodes' admin ports (with mutual TLS, a certificate of
            the ``admin`` role: growing a node and creating a partition change it); None: plaintext.
        storage_timeout: seconds for each storage node's admin calls (they run at once).
        operator: who asks, as told to the storage nodes (their audit line of the growth).

    Returns:
        The plan it carried out, ``opened`` True.

    Raises:
        ParentNotSealedError: the parent has no ``B(p)`` yet; nothing was written.
        SplitStateError: no such epoch or child; nothing was written.
        SplitStorageError: a storage node of the parent did not answer or refused; nothing was
            written to ZooKeeper (run again once the node is back).
        MetadataError: the parent has no replica in ``store/assignment``, a storage node has no
            admin port in ``store/connection``, or a znode does not decode.
        StaleMetadataError: a znode kept changing under the compare-and-set.
        ClusterNotFoundError, ZooKeeperUnavailableError, ZooKeeperAuthError: as :class:`ClusterZk`.
    """
    epochs = PartitionEpochsZk(cluster.zk, cluster.paths, timeout=cluster.timeout)
    split = epochs.read().value.epoch(epoch)
    plan = _plan(cluster, split, child)
    if plan.opened:
        log.info("epoch %d: child %d is opened already", epoch, child)
        return plan
    _make_replicas(cluster, plan, split.count, tls, storage_timeout, operator)
    _add_replica_assignments(cluster, plan)
    _create_partition_metadata(cluster, plan)
    opened = epochs.mark_opened(epoch, child).value.epoch(epoch).children[child]
    log.info(
        "epoch %d: child %d opened on %s, its log starting at %d after its parent %d's barrier",
        epoch,
        child,
        ", ".join(plan.storages),
        plan.start,
        plan.parent,
    )
    return dataclasses.replace(plan, opened=opened.opened, genesis=opened.genesis)


def _make_replicas(
    cluster: ClusterZk,
    plan: ChildOpenPlan,
    count: int,
    tls: TlsConfig | None,
    timeout: float,
    operator: str,
) -> None:
    """Step 1 on every storage node of the parent at once.

    Raises:
        SplitStorageError: a node did not answer or refused (the others did their part).
        MetadataError: a node has no admin port in ``store/connection``.
    """
    params = cluster.params()
    connection = cluster.connection().value
    addresses = {storage: connection.admin_address(storage) for storage in plan.storages}

    async def make(storage: str, admin: StorageAdminClient) -> int:
        node_count = (await admin.partition_status(-1)).num_partitions
        if node_count < count:
            before, node_count = await admin.grow_partitions(count, operator=operator)
            log.info("storage node %s: grew from %d to %d partitions", storage, before, node_count)
        await admin.assign_partition(plan.child, True, first_transaction_id=plan.start)
        return node_count

    outcomes = run_on_shared_loop(
        call_admin_on_nodes(
            addresses, str(params.cluster_key), params.num_partitions, make, timeout=timeout, tls=tls
        )
    )
    failures: dict[str, str] = {}
    for storage, outcome in outcomes.items():
        failure = outcome.failure
        if failure is not None:
            failures[storage] = failure
    if failures:
        unreachable = tuple(storage for storage, outcome in outcomes.items() if not outcome.reachable)
        raise SplitStorageError(plan.epoch, plan.child, failures, unreachable)


def _add_replica_assignments(cluster: ClusterZk, plan: ChildOpenPlan) -> None:
    """Step 2: the child's replicas in ``store/assignment`` (nothing written when they are there).

    Raises:
        StaleMetadataError: the znode kept changing.
    """
    for _ in range(MAX_CAS_ATTEMPTS):
        current = cluster.assignments()
        wanted = current.value
        for storage in plan.storages:
            wanted = wanted.with_replica(storage, plan.child, True)
        if wanted == current.value:
            return
        try:
            cluster.set_assignments(wanted, current.version)
        except StaleMetadataError:
            continue
        return
    raise StaleMetadataError(
        f"{cluster.paths.assignment} kept changing: gave up adding child {plan.child}'s replicas "
        f"after {MAX_CAS_ATTEMPTS} attempts; run the step again"
    )


def _create_partition_metadata(cluster: ClusterZk, plan: ChildOpenPlan) -> None:
    """Step 3: ``store/partition/<child>`` as :attr:`ChildOpenPlan.metadata`. One that exists with
    no store session yet is written to the plan's; one with a session is left as it is (the child
    is a server's already).

    Raises:
        StaleMetadataError: the znode kept changing.
    """
    wanted = plan.metadata
    for _ in range(MAX_CAS_ATTEMPTS):
        current = cluster.partition_metadata_if_any(plan.child)
        try:
            if current is None:
                cluster.create_partition_metadata(plan.child, wanted)
            elif current.value != wanted and current.value.session_id < 0:
                cluster.set_partition_metadata(plan.child, wanted, current.version)
        except StaleMetadataError:
            continue
        return
    raise StaleMetadataError(
        f"{cluster.paths.partition(plan.child)} kept changing: gave up after {MAX_CAS_ATTEMPTS} "
        "attempts; run the step again"
    )
