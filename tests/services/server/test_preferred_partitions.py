"""Preferred partitions with real servers: set at run time through ZooKeeper (``waltz server
preferred add``), reclaimed by a preferred server that comes back, after the cluster manager's
hysteresis (docs/design/server.md "Preferred partitions")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.local.processes import wait_until
from waltz.metadata.assignment import Member
from waltz.metadata.preferred import preferred_path, update_preferred
from waltz.metadata.zk import ClusterPaths
from waltz.services.server.cluster_manager import ClusterManager

#: The hysteresis of the test cluster's managers, seconds.
RECLAIM_DELAY = 2.0


def _local_cluster(tmp_path: Path, zookeeper: object, servers: int, partitions: int) -> LocalCluster:
    """A plaintext cluster of one storage node whose managers settle after :data:`RECLAIM_DELAY`."""
    return LocalCluster(
        security=support.PLAINTEXT,
        storages=1,
        servers=servers,
        partitions=partitions,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
        processes=ProcessOptions(
            server_env={"WALTZ_SERVER_PREFERRED_PARTITIONS_RECLAIM_DELAY": str(RECLAIM_DELAY)}
        ),
    )


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: object) -> Iterator[LocalCluster]:
    with _local_cluster(tmp_path, zookeeper, servers=2, partitions=2) as local:
        yield local


def _preferred(cluster: LocalCluster, verb: str, server: str, partition: int) -> None:
    result = CliRunner().invoke(
        app,
        [
            "server",
            "preferred",
            verb,
            server,
            "--partition",
            str(partition),
            "--zookeeper",
            cluster.zookeeper_connect_string,
            "--root",
            cluster.root,
        ],
    )
    assert result.exit_code == 0, result.output


def _owner_becomes(cluster: LocalCluster, partition: int, endpoint: str, what: str) -> None:
    def owned() -> bool:
        try:
            return cluster.owner(partition) == endpoint
        except Exception:
            return False

    wait_until(owned, timeout=60, what=what, interval=0.1)


def test_a_run_time_preference_moves_the_partition_and_a_restarted_preferred_server_reclaims_it(
    cluster: LocalCluster,
) -> None:
    other = cluster.servers[1 - cluster.owner_index(0)]
    # A preference set at run time moves partition 0 to a server that has been up long enough.
    _preferred(cluster, "add", other.endpoint, 0)
    _owner_becomes(
        cluster, 0, other.endpoint, f"partition 0 to move to its preferred server {other.endpoint}"
    )
    cluster.wait_ready(timeout=60)
    preferred_index = cluster.servers.index(other)
    survivor = cluster.servers[1 - preferred_index]

    # The preferred server crashes: its partitions move to the survivor.
    cluster.kill_server(preferred_index)
    _owner_becomes(cluster, 0, survivor.endpoint, "partition 0 to fail over to the surviving server")
    # It comes back: after the hysteresis it owns partition 0 again, and the cluster is writable.
    cluster.restart_server(preferred_index)
    _owner_becomes(cluster, 0, other.endpoint, "the restarted preferred server to reclaim partition 0")
    cluster.wait_ready(timeout=60)

    # Removing the preference leaves the partition where it is; preferring it elsewhere moves it.
    _preferred(cluster, "remove", other.endpoint, 0)
    _preferred(cluster, "add", survivor.endpoint, 0)
    _owner_becomes(cluster, 0, survivor.endpoint, "partition 0 to move to its new preferred server")
    cluster.wait_ready(timeout=60)


def test_a_member_settles_after_the_reclaim_delay_and_a_new_incarnation_starts_over(
    zk_client: KazooClient, zk_root: str
) -> None:
    now = [100.0]
    manager = ClusterManager(
        zk_client, ClusterPaths.of(zk_root), 2, "test", reclaim_delay=3.0, clock=lambda: now[0]
    )
    a, b = Member("member-0000000001", "127.0.0.1:1"), Member("member-0000000002", "127.0.0.1:2")
    assert manager._settled([a, b]) == set()
    now[0] += 3.0
    assert manager._settled([a, b]) == {a.name, b.name}
    # b restarts: a new member name, which waits the whole delay again.
    b2 = Member("member-0000000003", "127.0.0.1:2")
    assert manager._settled([a, b2]) == {a.name}
    assert manager._next_wakeup() == pytest.approx(3.05)
    now[0] += 3.0
    assert manager._settled([a, b2]) == {a.name, b2.name}


def test_a_malformed_preferences_znode_falls_back_to_the_configured_ones(
    zk_client: KazooClient, zk_root: str
) -> None:
    paths = ClusterPaths.of(zk_root)
    manager = ClusterManager(zk_client, paths, 2, "test")
    a = Member("member-0000000001", "127.0.0.1:1", (1,))
    update_preferred(zk_client, paths, a.endpoint, a.preferred_partitions, add=[0])
    assert manager.effective_members([a]) == [Member(a.name, a.endpoint, (0, 1))]
    zk_client.set(preferred_path(paths), b"not json")
    assert manager.effective_members([a]) == [a]


def test_the_last_server_of_a_rolling_restart_takes_its_share_once_settled(
    tmp_path: Path, zookeeper: object
) -> None:
    # docs/design/server.md "Cluster manager": with 4 partitions on 3 servers, the one restarted
    # last finds the others within their fair share (2 each); once settled, it takes one.
    with _local_cluster(tmp_path, zookeeper, servers=3, partitions=4) as cluster:

        def owned(index: int) -> int:
            endpoint = cluster.servers[index].endpoint
            try:
                return sum(cluster.owner(pid) == endpoint for pid in range(4))
            except Exception:
                return -1

        for index in range(3):
            # A graceful stop moves its partitions at once, so the others hold all 4 when it
            # comes back (a kill would leave them on its old member until its session expired).
            cluster.stop_server(index)
            wait_until(lambda i=index: owned(i) == 0, timeout=60, what=f"server {index}'s partitions to move")
            cluster.restart_server(index)
            wait_until(lambda i=index: owned(i) >= 1, timeout=60, what=f"server {index} to take a partition")
        cluster.wait_ready(timeout=60)
        assert sorted(owned(i) for i in range(3)) == [1, 1, 2]


def test_a_server_that_registers_again_after_a_lost_session_keeps_its_reclaim_delay(
    zk_client: KazooClient, zk_root: str
) -> None:
    """After its ZooKeeper session was lost and a new one made, a server registers again and takes
    part in the election with a new cluster manager: one with the server's
    ``server.preferredPartitionsReclaimDelay``, not the default 30 s."""
    import asyncio
    import uuid

    from waltz.metadata.values import ClusterParams, ConnectionMetadata, GroupDescriptor, ReplicaAssignments
    from waltz.metadata.zk import ClusterZk
    from waltz.services.server.app import ServerApp
    from waltz.services.server.cluster_manager import ServerMembership
    from waltz.services.server.config import ServerConfig

    cluster = ClusterZk(zk_client, zk_root)
    cluster.create(
        ClusterParams("again", 2, uuid.uuid4()),
        ReplicaAssignments({"h:1": (0, 1)}),
        GroupDescriptor({"h:1": 0}),
        ConnectionMetadata({"h:1": 2}),
    )
    config = ServerConfig(
        zookeeper_connect_string="127.0.0.1:1",  # unused: the test hands the server its session
        cluster_root=zk_root,
        server_preferred_partitions_reclaim_delay=RECLAIM_DELAY,
        server_insecure=True,  # no port is opened
    )
    server = ServerApp(config)
    server._zk, server._cluster, server.num_partitions = zk_client, cluster, 2
    server._membership = ServerMembership(zk_client, cluster.paths, "127.0.0.1:1", (), lambda _: None)
    server._stopping = True  # no partitions/epochs read: only the election is looked at
    asyncio.run(server._register_again())
    manager = server._manager
    assert manager is not None
    try:
        assert manager._reclaim_delay == RECLAIM_DELAY
    finally:
        manager.stop()
        server._membership.unregister()
