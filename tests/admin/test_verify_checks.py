"""The checks of ``waltz cluster verify`` on hand-made metadata and probes (no processes):
corner cases the process tests cannot reach cheaply (waltz.admin.verify)."""

from __future__ import annotations

import uuid

from waltz.admin.description import ClusterDescription, PartitionInfo, StorageNodeInfo
from waltz.admin.verify import (
    CheckStatus,
    ReplicaStatus,
    StorageProbe,
    VerifyReport,
    verify_cluster,
)
from waltz.metadata.values import ClusterParams, PartitionMetadata, ReplicaState

A, B, C = "10.0.0.1:55280", "10.0.0.2:55280", "10.0.0.3:55280"
PARAMS = ClusterParams("test", 2, uuid.UUID(int=7))


def describe(nodes: list[StorageNodeInfo], metadata: list[PartitionMetadata | None]) -> ClusterDescription:
    partitions = tuple(
        PartitionInfo(
            pid,
            md,
            tuple(sorted(n.connect_string for n in nodes if pid in n.partitions)),
            None if md is not None else "znode /x/store/partition/1 is missing",
        )
        for pid, md in enumerate(metadata)
    )
    return ClusterDescription("/x", PARAMS, tuple(nodes), partitions)


def healthy(storage: str, partitions: list[int], last_session_id: int = -1) -> StorageProbe:
    return StorageProbe(
        storage,
        f"{storage.rpartition(':')[0]}:55281",
        True,
        partitions={p: ReplicaStatus(p, last_session_id=last_session_id) for p in partitions},
    )


def status_of(report: VerifyReport, name: str) -> CheckStatus:
    [check] = [c for c in report.checks if c.name == name]
    return check.status


def detail_of(report: VerifyReport, name: str) -> str:
    [check] = [c for c in report.checks if c.name == name]
    return check.detail


def test_everything_in_order_passes() -> None:
    nodes = [StorageNodeInfo(s, 55281, 0, (0, 1)) for s in (A, B, C)]
    metadata = PartitionMetadata(1, 3, {s: ReplicaState(3) for s in (A, B, C)})
    report = verify_cluster(
        describe(nodes, [metadata, PartitionMetadata(0, -1)]),
        {s: healthy(s, [0, 1], last_session_id=3) for s in (A, B, C)},
    )
    assert report.passed
    assert report.count(CheckStatus.PASSED) == len(report.checks) == 4 + 3 * 3 + 3 * 2
    assert report.to_json()["passed"] is True


def test_missing_admin_port_missing_partition_znode_and_unreplicated_partition_fail() -> None:
    nodes = [StorageNodeInfo(A, None, 0, (0,)), StorageNodeInfo(B, 55281, None, (0,))]
    report = verify_cluster(
        describe(nodes, [PartitionMetadata(0, -1), None]),
        {
            A: StorageProbe(A, None, False, "no admin port in store/connection"),
            B: healthy(B, [0]),
        },
    )
    assert not report.passed
    assert "has no admin port" in detail_of(report, "zookeeper: storage nodes")
    assert f"{B} has no group" in detail_of(report, "zookeeper: storage nodes")
    assert status_of(report, "zookeeper: partition metadata") is CheckStatus.FAILED
    assert "partitions without any replica: 1" in detail_of(report, "zookeeper: replica assignment")
    assert status_of(report, f"storage {A}: reachable") is CheckStatus.FAILED
    # 1 of 2 replicas is not a quorum of 2.
    assert status_of(report, "partition 0: quorum of replicas available") is CheckStatus.FAILED
    assert status_of(report, "partition 1: quorum of replicas available") is CheckStatus.FAILED


def test_missing_and_extra_partitions_on_a_node_fail_but_only_when_the_list_is_complete() -> None:
    nodes = [StorageNodeInfo(A, 55281, 0, (0,))]
    description = describe(nodes, [PartitionMetadata(0, -1), PartitionMetadata(0, -1)])
    report = verify_cluster(description, {A: healthy(A, [1])})
    detail = detail_of(report, f"storage {A}: partitions match the assignment")
    assert "not on the node: 0" in detail and "not assigned in ZooKeeper: 1" in detail
    partial = StorageProbe(A, "10.0.0.1:55281", True, partitions={1: ReplicaStatus(1)}, complete=False)
    detail = detail_of(
        verify_cluster(description, {A: partial}), f"storage {A}: partitions match the assignment"
    )
    assert "not on the node: 0" in detail and "not assigned" not in detail


def test_a_partition_that_does_not_open_counts_as_corrupt_and_unavailable() -> None:
    nodes = [StorageNodeInfo(s, 55281, 0, (0,)) for s in (A, B, C)]
    broken = StorageProbe(
        C,
        "10.0.0.3:55281",
        True,
        partitions={0: ReplicaStatus(0, error="refused: CORRUPT_DATA: bad header")},
        complete=False,
    )
    report = verify_cluster(
        describe(nodes, [PartitionMetadata(0, -1), PartitionMetadata(0, -1)]),
        {A: healthy(A, [0]), B: healthy(B, [0]), C: broken},
    )
    assert "2 of 3 replicas available" in detail_of(report, "partition 0: quorum of replicas available")
    assert status_of(report, "partition 0: no corrupt records") is CheckStatus.FAILED
    assert "CORRUPT_DATA" in detail_of(report, "partition 0: no corrupt records")


def test_a_replica_behind_its_zookeeper_session_is_only_a_warning() -> None:
    nodes = [StorageNodeInfo(A, 55281, 0, (0,))]
    metadata = PartitionMetadata(1, 4, {A: ReplicaState(4)})
    report = verify_cluster(
        describe(nodes, [metadata, PartitionMetadata(0, -1)]), {A: healthy(A, [0], last_session_id=2)}
    )
    name = "partition 0: replica sessions consistent with ZooKeeper"
    assert status_of(report, name) is CheckStatus.WARNING
    assert "last session 2" in detail_of(report, name) and "session 4" in detail_of(report, name)
    assert not report.passed  # partition 1 has no replica: that one fails
    assert report.count(CheckStatus.WARNING) == 1
