"""Step 4 of a split, "Open": a new child's replicas on its parent's storage nodes, its metadata and
its opened mark, and the refusals that come before anything is written (docs/design/splits.md
"The handover", step 4; docs/design/storage.md "Partition count").

Real storage and server processes and a real ZooKeeper: the test writes ``partitions/epochs`` as
a split's steps do (prepare, mark a parent sealing), and the parent's owner appends its barrier
and writes ``B(p)``. A child whose parent has no ``B(p)`` is refused with nothing written; once
it has one, ``open_child`` grows the storage node from the 2 partitions the cluster was created
with to 4 and creates the child there as an empty log after the barrier, then writes ZooKeeper.
A second call writes nothing; a storage node that does not answer stops it before ZooKeeper is
written, and a run cut short before the opened mark is finished by the next. The cluster's
description (``waltz cluster list``, ``verify``) then names the children.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from support.storage import run

from tests.services.server.test_epoch_refusals import start_cluster
from tests.services.server.test_split_barrier import opened_high_water_mark, wait_for_barrier, with_epochs
from waltz.admin.description import describe_cluster
from waltz.admin.fences import read_fence
from waltz.admin.servers import change_preferred
from waltz.admin.split_open import ChildOpenPlan, open_child, plan_child_open
from waltz.admin.verify import CheckStatus, metadata_checks
from waltz.archive.status import archive_status
from waltz.errors import (
    ConfigurationError,
    MetadataError,
    ParentNotSealedError,
    SplitStateError,
    SplitStorageError,
)
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk
from waltz.protocol import storage_pb2
from waltz.protocol.storage_client import StorageAdminClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A 2-partition cluster prepared for epoch 1 (4 partitions), no parent sealing yet."""
    with start_cluster(tmp_path_factory.mktemp("split-open"), zookeeper) as cluster:
        cluster.wait_ready(60)
        with_epochs(cluster, "prepare", 4, {0: -1, 1: -1})
        yield cluster


@pytest.fixture
def cluster_zk(cluster: LocalCluster) -> Iterator[ClusterZk]:
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    try:
        yield ClusterZk(zk, cluster.root, timeout=30)
    finally:
        zk.stop()
        zk.close()


def snapshot(cluster_zk: ClusterZk, child_id: int = 2) -> tuple[bytes, bytes | None, PartitionEpochs]:
    """``store/assignment``, ``store/partition/<child_id>`` (None: absent) and the epochs' value."""
    assignment, _ = cluster_zk.zk.get(cluster_zk.paths.assignment)
    try:
        child, _ = cluster_zk.zk.get(cluster_zk.paths.partition(child_id))
    except NoNodeError:
        child = None
    return assignment, child, PartitionEpochsZk(cluster_zk.zk, cluster_zk.paths, timeout=30).read().value


def test_a_child_is_refused_before_its_parent_has_a_barrier(cluster_zk: ClusterZk) -> None:
    before = snapshot(cluster_zk)
    for child in (2, 3):
        for step in (plan_child_open, open_child):
            with pytest.raises(
                ParentNotSealedError, match=f"child {child} opens after its parent"
            ) as refused:
                step(cluster_zk, 1, child)
            assert (refused.value.parent, refused.value.sealing) == (child - 2, False)
    assert snapshot(cluster_zk) == before


def test_only_a_new_child_of_an_existing_epoch_is_planned(cluster_zk: ClusterZk) -> None:
    for step in (plan_child_open, open_child):
        with pytest.raises(SplitStateError, match="partition 1 is not a new child of epoch 1"):
            step(cluster_zk, 1, 1)
        with pytest.raises(SplitStateError, match="there is no epoch 2"):
            step(cluster_zk, 2, 4)


def node_partitions(cluster: LocalCluster) -> tuple[int, dict[int, storage_pb2.PartitionStatus]]:
    """The storage node's partition count and the status of each partition it holds."""

    async def status() -> storage_pb2.PartitionStatusResponse:
        (node,) = cluster.storages
        async with StorageAdminClient(
            node.admin_address, str(cluster.cluster_key), cluster.num_partitions, tls=cluster.admin_tls
        ) as admin:
            return await admin.partition_status(-1)

    response = run(status())
    return response.num_partitions, {p.partition_id: p for p in response.partitions}


def versions(cluster_zk: ClusterZk) -> tuple[int, int]:
    """The znode versions of ``store/assignment`` and ``partitions/epochs``."""
    return (
        cluster_zk.zk.exists(cluster_zk.paths.assignment).version,
        cluster_zk.zk.exists(cluster_zk.paths.epochs).version,
    )


def seal(cluster: LocalCluster, parent: int, client_id: int) -> int:
    """Mark ``parent`` sealing; its owner appends the barrier and writes ``B(parent)``, returned."""
    with_epochs(cluster, "mark_sealing", 1, parent)
    opened_high_water_mark(cluster, parent, client_id)  # the partition opens (it would anyway)
    barrier = wait_for_barrier(cluster, parent)
    assert barrier is not None, f"parent {parent}'s owner wrote no B({parent})"
    return barrier


def test_a_child_of_a_sealed_parent_opens_on_its_parents_storage_nodes_after_the_barrier(
    cluster: LocalCluster, cluster_zk: ClusterZk
) -> None:
    barrier = seal(cluster, 0, 700)
    (storage,) = cluster_zk.assignments().value.storages_of(0)
    assert node_partitions(cluster)[0] == 2
    plan = open_child(cluster_zk, 1, 2)
    assert plan == ChildOpenPlan(1, 2, 0, barrier, (storage,), True, None)
    # The node grew to the epoch's count and holds the child as an empty log after the barrier.
    count, held = node_partitions(cluster)
    assert count == 4 and sorted(held) == [0, 1, 2]
    assert held[2].local_start == barrier + 1, held[2]
    assert held[2].max_transaction_id in (barrier, barrier + 1), held[2]  # the genesis may be there
    # ZooKeeper: the child's replica, its metadata closed at B(0), and the opened mark.
    assert cluster_zk.assignments().value.storages_of(2) == [storage]
    # (Opened, the child is placed on the server at once, whose store session may have begun.)
    metadata = cluster_zk.partition_metadata(2).value
    assert set(metadata.replicas) == {storage}
    assert metadata == plan.metadata or metadata.session_id >= 0, metadata
    assert with_epochs(cluster, "read").epoch(1).children[2].opened
    # The child's owner appends its genesis and writes its ID: after that, nothing moves.
    genesis = wait_until(
        lambda: with_epochs(cluster, "read").epoch(1).children[2].genesis,
        timeout=60,
        what="child 2's genesis in partitions/epochs",
        interval=0.1,
    )
    assert genesis == barrier + 1
    # Done: a second call writes nothing and answers the same plan.
    before = versions(cluster_zk)
    assert open_child(cluster_zk, 1, 2) == dataclasses.replace(plan, genesis=genesis)
    assert versions(cluster_zk) == before
    assert node_partitions(cluster)[0] == 4
    # Child 3's parent is not sealing: its refusal says so, and nothing of it is written.
    with pytest.raises(ParentNotSealedError, match="child 3 opens after its parent 1") as refused:
        open_child(cluster_zk, 1, 3)
    assert not refused.value.sealing and "not marked sealing" in str(refused.value)
    assert snapshot(cluster_zk, 3)[1] is None
    # The operator's tools take the opened child as a partition of the cluster, not child 3.
    fence = read_fence(cluster_zk, storage, 2, tls=cluster.admin_tls)
    assert fence.partition_id == 2 and fence.fence >= 0 and fence.zookeeper_session_id >= 0, fence
    with pytest.raises(
        MetadataError, match=r"partition 3 does not exist: .*0\.\.1 and, opened by a split, 2$"
    ):
        read_fence(cluster_zk, storage, 3, tls=cluster.admin_tls)
    # The archive does not follow a split yet: its status says which partitions it leaves out.
    status = archive_status(cluster_zk, None, tls=cluster.admin_tls)
    assert status.not_archived == [2] and [line.partition_id for line in status.partitions] == [0, 1]
    assert status.to_json()["not_archived"] == [2]
    server = cluster.owner(0)
    _, _, after = change_preferred(cluster_zk.zk, cluster.root, server, add=[2])
    assert 2 in after
    change_preferred(cluster_zk.zk, cluster.root, server, remove=[2])
    with pytest.raises(ConfigurationError, match="partitions \\[3, 5\\] do not exist"):
        change_preferred(cluster_zk.zk, cluster.root, server, add=[3, 5])


def test_an_unreachable_storage_node_writes_nothing_and_a_run_cut_short_is_finished_by_the_next(
    cluster: LocalCluster, cluster_zk: ClusterZk
) -> None:
    barrier = seal(cluster, 1, 701)
    (storage,) = cluster_zk.assignments().value.storages_of(1)
    before = snapshot(cluster_zk, 3)
    cluster.stop_storage(0)
    try:
        with pytest.raises(SplitStorageError, match=r"child 3's replicas could not be made") as refused:
            open_child(cluster_zk, 1, 3, storage_timeout=3)
        assert refused.value.unreachable == (storage,) and list(refused.value.failures) == [storage]
        assert snapshot(cluster_zk, 3) == before and before[1] is None
    finally:
        cluster.restart_storage(0)
    # What a run stopped after creating the replica and the metadata, before the opened mark,
    # leaves: the node grown to the epoch's count (child 2's run may have grown it already) holds
    # the child, store/assignment and store/partition/3 name it.
    plan = plan_child_open(cluster_zk, 1, 3)
    assert not plan.opened and plan.start == barrier + 1

    async def replica() -> None:
        (node,) = cluster.storages
        async with StorageAdminClient(
            node.admin_address, str(cluster.cluster_key), cluster.num_partitions, tls=cluster.admin_tls
        ) as admin:
            if (await admin.partition_status(-1)).num_partitions < 4:
                await admin.grow_partitions(4, operator="test")
            await admin.assign_partition(3, True, first_transaction_id=plan.start)

    run(replica())
    assignments = cluster_zk.assignments()
    cluster_zk.set_assignments(assignments.value.with_replica(storage, 3, True), assignments.version)
    cluster_zk.create_partition_metadata(3, plan.metadata)
    opened = open_child(cluster_zk, 1, 3)
    assert opened == dataclasses.replace(plan, opened=True)
    assert with_epochs(cluster, "read").epoch(1).children[3].opened
    count, held = node_partitions(cluster)
    # Opened, the child is placed at once, and its owner may have appended its genesis already.
    assert count == 4 and held[3].local_start == barrier + 1, held[3]
    assert held[3].max_transaction_id in (barrier, barrier + 1), held[3]
    assert cluster_zk.assignments().value.storages_of(3) == [storage]
    # The cluster's description names the opened children (child 2 too when the test before
    # opened it), and ZooKeeper's checks pass with them.
    children = with_epochs(cluster, "read").epoch(1).children
    opened_children = sorted(c for c, progress in children.items() if progress.opened)
    assert 3 in opened_children
    description = describe_cluster(cluster_zk)
    assert [p.partition_id for p in description.partitions] == [0, 1, *opened_children]
    checks = metadata_checks(description)
    assert all(c.status is CheckStatus.PASSED for c in checks), checks
    assert f"2 partitions at creation, {2 + len(opened_children)} now" in checks[0].detail


def test_a_plan_starts_the_child_after_the_barrier_with_each_replica_closed_there() -> None:
    plan = ChildOpenPlan(1, 2, 0, 45, ("127.0.0.1:7001", "127.0.0.1:7002"), False, None)
    assert plan.start == 46
    assert plan.metadata == PartitionMetadata(
        0, -1, {"127.0.0.1:7001": ReplicaState(-1, 45), "127.0.0.1:7002": ReplicaState(-1, 45)}
    )
