"""The archive's summary at ``<root>/archive``: its JSON form, compare-and-set writes and the
cluster's digest ACL, on a real ZooKeeper (docs/design/zookeeper.md "The archive's summary")."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz.errors import ClusterNotFoundError, MetadataError, StaleMetadataError
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.values import (
    ArchivedPartition,
    ArchiveSummary,
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    ReplicaAssignments,
)
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import connect_zookeeper

MARKS = st.integers(-1, 2**62)


def create_cluster(zk: KazooClient, root: str) -> ClusterZk:
    cluster = ClusterZk(zk, root)
    cluster.create(
        ClusterParams("archived", 2, uuid.uuid4()),
        ReplicaAssignments({"h:1": (0, 1)}),
        GroupDescriptor({"h:1": 0}),
        ConnectionMetadata({"h:1": 2}),
    )
    return cluster


@given(
    st.text(min_size=1),
    st.dictionaries(
        st.integers(0, 1000), st.builds(ArchivedPartition, MARKS, st.integers(0), st.integers(0))
    ),
)
def test_a_summary_decodes_to_itself(location: str, partitions: dict[int, ArchivedPartition]) -> None:
    summary = ArchiveSummary(location, partitions)
    assert ArchiveSummary.decode(summary.encode(), "/r/archive") == summary


def test_the_znode_holds_the_location_and_per_partition_entries() -> None:
    summary = ArchiveSummary("s3://bucket/log").with_partition(1, ArchivedPartition(99, 1, 4096))
    assert json.loads(summary.encode()) == {
        "format_version": 1,
        "location": "s3://bucket/log",
        "partitions": {"1": {"archived_through": 99, "chunks": 1, "bytes": 4096}},
    }
    assert summary.of(0) == ArchivedPartition(-1, 0, 0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"format_version": 1, "partitions": {}}', "lacks the field 'location'"),
        (b'{"format_version": 1, "location": "x", "partitions": {"a": {}}}', "partition 'a'"),
        (
            b'{"format_version": 1, "location": "x", "partitions": '
            b'{"0": {"archived_through": "9", "chunks": 0, "bytes": 0}}}',
            "integer",
        ),
        (b'{"format_version": 2, "location": "x", "partitions": {}}', "format version 2"),
        (b'{"location": "x", "partitions": {}}', "lacks the field 'format_version'"),
    ],
)
def test_a_malformed_summary_names_the_znode(data: bytes, message: str) -> None:
    with pytest.raises(MetadataError, match=message) as raised:
        ArchiveSummary.decode(data, "/r/archive")
    assert "znode /r/archive" in str(raised.value)


def test_created_once_then_changed_by_compare_and_set(zk_client: KazooClient, zk_root: str) -> None:
    with pytest.raises(ClusterNotFoundError):
        ClusterZk(zk_client, zk_root).archive_summary()
    cluster = create_cluster(zk_client, zk_root)
    assert cluster.archive_summary() is None
    first = ArchiveSummary("/archive/a")
    assert cluster.set_archive_summary(first, -1) == 0
    with pytest.raises(StaleMetadataError, match="created by another writer"):
        cluster.set_archive_summary(first, -1)
    current = cluster.archive_summary()
    assert current is not None and current.value == first and current.version == 0
    raised = first.with_partition(0, ArchivedPartition(10, 1, 100))
    assert cluster.set_archive_summary(raised, 0) == 1
    with pytest.raises(StaleMetadataError, match="changed since version 0"):
        cluster.set_archive_summary(first, 0)
    again = cluster.archive_summary()
    assert again is not None and again.value.of(0).archived_through == 10


@pytest.fixture
def secured(zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str) -> Iterator[KazooClient]:
    client = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity("archiver:s3cret"))
    try:
        yield client
    finally:
        with contextlib.suppress(NoNodeError):
            client.delete(zk_root, recursive=True)
        client.stop()
        client.close()


def test_the_summary_has_the_clusters_digest_acl(secured: KazooClient, zk_root: str) -> None:
    cluster = create_cluster(secured, zk_root)
    cluster.set_archive_summary(ArchiveSummary("/archive/a"), -1)
    assert secured.get_acls(cluster.paths.archive)[0] == ZooKeeperSecurity("archiver:s3cret").acl()
