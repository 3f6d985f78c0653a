"""Step 4 of a split, "Open": what opening a new child needs, and the refusals that come before
anything is written (docs/design/splits.md "The handover", step 4).

Real storage and server processes and a real ZooKeeper: the test writes ``partitions/epochs`` as
a split's steps do (prepare, mark parent 0 sealing), and parent 0's owner appends its barrier and
writes ``B(0)``. A child whose parent has no ``B(p)`` is refused; one whose parent has it is
refused too, because the storage nodes hold only the partitions of the count the cluster was
created with: in both cases nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from tests.services.server.test_epoch_refusals import start_cluster
from tests.services.server.test_split_barrier import opened_high_water_mark, wait_for_barrier, with_epochs
from waltz.admin.split_open import ChildBeyondStorageError, ChildOpenPlan, plan_child_open
from waltz.errors import SplitStateError
from waltz.local.cluster import LocalCluster
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk


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


def snapshot(cluster_zk: ClusterZk) -> tuple[bytes, bytes | None, PartitionEpochs]:
    """``store/assignment``, ``store/partition/2`` (None: absent) and the epochs' value."""
    assignment, _ = cluster_zk.zk.get(cluster_zk.paths.assignment)
    try:
        child, _ = cluster_zk.zk.get(cluster_zk.paths.partition(2))
    except NoNodeError:
        child = None
    return assignment, child, PartitionEpochsZk(cluster_zk.zk, cluster_zk.paths, timeout=30).read().value


def test_a_child_is_refused_before_its_parent_has_a_barrier(cluster_zk: ClusterZk) -> None:
    before = snapshot(cluster_zk)
    for child in (2, 3):
        with pytest.raises(SplitStateError, match=f"child {child} opens after its parent") as refused:
            plan_child_open(cluster_zk, 1, child)
        assert not isinstance(refused.value, ChildBeyondStorageError)
    assert snapshot(cluster_zk) == before


def test_only_a_new_child_of_an_existing_epoch_is_planned(cluster_zk: ClusterZk) -> None:
    with pytest.raises(SplitStateError, match="partition 1 is not a new child of epoch 1"):
        plan_child_open(cluster_zk, 1, 1)
    with pytest.raises(SplitStateError, match="there is no epoch 2"):
        plan_child_open(cluster_zk, 2, 4)


def test_a_child_of_a_sealed_parent_is_refused_while_the_storage_nodes_cannot_hold_it(
    cluster: LocalCluster, cluster_zk: ClusterZk
) -> None:
    with_epochs(cluster, "mark_sealing", 1, 0)
    # A partition opens at its first client: its owner then appends the barrier and writes B(0).
    assert opened_high_water_mark(cluster, 0, 700) == 0
    barrier = wait_for_barrier(cluster, 0)
    assert barrier == 0, "parent 0's owner wrote no B(0) for its barrier at 0"
    before = snapshot(cluster_zk)
    with pytest.raises(ChildBeyondStorageError, match=r"hold partitions 0\.\.1 only") as refused:
        plan_child_open(cluster_zk, 1, 2)
    assert (refused.value.child, refused.value.storage_count) == (2, 2)
    # Nothing written: no metadata of the child, the replica assignment as it was, not opened.
    after = snapshot(cluster_zk)
    assert after == before and after[1] is None
    # Child 3's parent is not sealed: its refusal is still the barrier's.
    with pytest.raises(SplitStateError, match="child 3 opens after its parent 1"):
        plan_child_open(cluster_zk, 1, 3)


def test_a_plan_starts_the_child_after_the_barrier_with_each_replica_closed_there() -> None:
    plan = ChildOpenPlan(1, 2, 0, 45, ("127.0.0.1:7001", "127.0.0.1:7002"), False, None)
    assert plan.start == 46
    assert plan.metadata == PartitionMetadata(
        0, -1, {"127.0.0.1:7001": ReplicaState(-1, 45), "127.0.0.1:7002": ReplicaState(-1, 45)}
    )
