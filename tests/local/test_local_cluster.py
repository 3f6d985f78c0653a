"""LocalCluster: ZooKeeper, storage nodes and servers as processes, ready, failing over, closed cleanly."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from support.storage import run

from waltz.errors import ConfigurationError
from waltz.local import cluster as local_cluster
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions, SecurityOptions
from waltz.local.processes import ServiceStartError
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.zk_session import ZooKeeperUnavailableError
from waltz.protocol.records import Record, ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.tuning import GRPC_EXPERIMENTS, GRPC_FORK_SUPPORT

SESSION_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def shared_cluster(
    zookeeper: LocalZooKeeper | DockerZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """3 storage nodes, 2 servers, 2 partitions on the session ZooKeeper, with metrics ports."""
    with LocalCluster(
        storages=3,
        servers=2,
        partitions=2,
        zookeeper=zookeeper.connect_string,
        work_dir=tmp_path_factory.mktemp("local-cluster"),
        delete_root=True,
        processes=ProcessOptions(metrics=True, session_timeout=SESSION_TIMEOUT),
    ) as cluster:
        print(f"LocalCluster(3 storages, 2 servers, 2 partitions) ready in {cluster.startup_seconds:.2f}s")
        yield cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, shared_cluster: LocalCluster) -> LocalCluster:
    for node in (*shared_cluster.storages, *shared_cluster.servers):
        support.add_failure_logs(request.node, f"{node.process.name} log", node.process.log_tail)
    return shared_cluster


def append(cluster: LocalCluster, endpoint: str, partition_id: int, seq: int, data: bytes) -> int | str:
    async def go() -> int | str:
        async with ServerAdminClient(endpoint, tls=cluster.admin_tls, timeout=20) as client:
            (outcome,) = await client.append(partition_id, [(ReqId(7, 0, partition_id, seq), 0, data)])
            return outcome

    return run(go())


def read(cluster: LocalCluster, endpoint: str, partition_id: int, transaction_id: int) -> list[Record]:
    async def go() -> list[Record]:
        async with ServerAdminClient(endpoint, tls=cluster.admin_tls, timeout=20) as client:
            return await client.read(partition_id, transaction_id, 100)

    return run(go())


def test_every_partition_has_a_writable_owner_among_the_servers(cluster: LocalCluster) -> None:
    owners = cluster.wait_ready(timeout=10)

    assert sorted(owners) == [0, 1]
    # Ready means settled: each server holds its share, so the owners read now stay the owners.
    assert sorted(map(len, cluster.owned_partitions().values())) == [1, 1]
    for pid, owner in owners.items():
        assert owner.endpoint == cluster.owner(pid)
        assert owner.endpoint in cluster.server_endpoints
        assert cluster.servers[cluster.owner_index(pid)].endpoint == owner.endpoint
    assert len(cluster.storages) == 3
    assert re.fullmatch(r"[0-9a-f-]{36}", cluster.cluster_key)


def test_an_append_through_the_owner_is_committed_and_read_back(cluster: LocalCluster) -> None:
    start = cluster.wait_ready(timeout=10)[1].high_water_mark + 1

    transaction_id = append(cluster, cluster.owner(1), 1, 1, b"hello waltz")

    assert transaction_id == start
    (record,) = read(cluster, cluster.owner(1), 1, start)
    assert (record.transaction_id, record.data, record.req_id.seq_num) == (start, b"hello waltz", 1)
    assert record.checksum_ok()


def test_describe_names_zookeeper_the_root_and_every_port(cluster: LocalCluster) -> None:
    text = cluster.describe()

    assert cluster.zookeeper_connect_string in text
    assert cluster.root in text
    ports = [s.port for s in cluster.servers] + [s.metrics_port for s in cluster.servers]
    ports += [n.port for n in cluster.storages] + [n.admin_port for n in cluster.storages]
    ports += [n.metrics_port for n in cluster.storages]
    assert None not in ports
    for port in ports:
        assert re.search(rf"127\.0\.0\.1:{port}\b", text), f"port {port} missing from:\n{text}"


def test_every_node_logs_the_grpc_settings_it_runs_with(cluster: LocalCluster) -> None:
    # Started as `python -m waltz.services.<node>`, which sets them unless the environment does.
    if "GRPC_EXPERIMENTS" in os.environ:
        experiments = os.environ["GRPC_EXPERIMENTS"] or "(gRPC's defaults)"
    else:
        experiments = GRPC_EXPERIMENTS
    if "GRPC_ENABLE_FORK_SUPPORT" in os.environ:
        fork_support = os.environ["GRPC_ENABLE_FORK_SUPPORT"] or "(gRPC's default)"
    else:
        fork_support = GRPC_FORK_SUPPORT
    expected = f"{experiments}; fork support: {fork_support}"
    for node in (*cluster.storages, *cluster.servers):
        assert node.process.log_path is not None
        lines = [
            line
            for line in node.process.log_path.read_text(errors="replace").splitlines()
            if "gRPC core experiments:" in line
        ]
        assert lines, f"{node.process.name} logged no gRPC experiments:\n{node.process.log_tail()}"
        assert lines[-1].endswith(f"gRPC core experiments: {expected}"), lines[-1]


def test_kill_9_of_the_owner_moves_the_partition_to_another_writable_server(cluster: LocalCluster) -> None:
    before = cluster.wait_ready(timeout=10)[0]
    first = append(cluster, before.endpoint, 0, 100, b"before the crash")
    assert isinstance(first, int)
    victim = cluster.owner_index(0)
    try:
        cluster.kill_server(victim)

        after = cluster.wait_ready(timeout=SESSION_TIMEOUT * 8)[0]

        assert after.endpoint != before.endpoint
        assert after.generation > before.generation
        second = append(cluster, after.endpoint, 0, 101, b"after the crash")
        assert second == first + 1
        assert [r.data for r in read(cluster, after.endpoint, 0, first)] == [
            b"before the crash",
            b"after the crash",
        ]
    finally:
        cluster.heal(timeout=30)
    assert cluster.servers[victim].process.is_running()


def test_close_stops_every_process_and_removes_the_temporary_work_dir() -> None:
    """The cluster's own ZooKeeper this time (no ``zookeeper`` argument)."""
    try:
        cluster = LocalCluster(
            storages=1, servers=1, partitions=1, processes=ProcessOptions(session_timeout=SESSION_TIMEOUT)
        )
    except ConfigurationError as error:  # no java or no ZooKeeper jars
        support.unavailable(str(error))
    with cluster:
        cluster.restart_storage(0)  # a second PID for the same node
        pids = cluster.pids()
        assert sorted(pids) == ["server-0", "storage-0", "zookeeper"]
        assert all(support.pid_is_alive(pid) for pid in pids.values())
        work_dir = cluster.work_dir
        assert work_dir.is_dir()
        cluster.wait_ready(timeout=30)

    assert not [name for name, pid in pids.items() if support.pid_is_alive(pid)]
    assert cluster.pids() == {}
    assert not work_dir.exists()
    cluster.close()  # idempotent


def test_a_failed_start_leaves_no_process_behind(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, tmp_path: Path
) -> None:
    cluster = LocalCluster(
        storages=2,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        root=zk_root,
        work_dir=tmp_path,
        processes=ProcessOptions(server_args=["--no-such-option"]),
        security=SecurityOptions.plaintext(),  # zk_root's anonymous session deletes what it made
    )

    with pytest.raises(ServiceStartError, match="server-0 exited"):
        cluster.start()

    started = [n.process.pid for n in cluster.storages] + [s.process.pid for s in cluster.servers]
    assert len(started) == 3 and None not in started
    assert not [pid for pid in started if pid is not None and support.pid_is_alive(pid)]
    assert (tmp_path / "logs" / "server-0.log").read_text().count("No such option") >= 1


def test_a_kept_work_dir_starts_the_same_cluster_again(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_client: KazooClient, tmp_path: Path
) -> None:
    def make(partitions: int = 1, delete_root: bool = False) -> LocalCluster:
        return LocalCluster(
            storages=1,
            servers=1,
            partitions=partitions,
            zookeeper=zookeeper.connect_string,
            work_dir=tmp_path,
            delete_root=delete_root,
        )

    with make() as first:
        root, key, storage_port = first.root, first.cluster_key, first.storages[0].port
        # One cluster runs on a work directory at a time: a second refuses before it starts anything.
        with pytest.raises(ConfigurationError, match="is in use by a local cluster that runs now"):
            make().start()
        assert append(first, first.owner(0), 0, 1, b"kept") == 0
    assert zk_client.exists(root) is not None

    with pytest.raises(ConfigurationError, match="partitions 1 \\(asked: 2\\)"):
        make(partitions=2).start()
    with make(delete_root=True) as second:
        assert (second.root, second.cluster_key, second.storages[0].port) == (root, key, storage_port)
        assert [r.data for r in read(second, second.owner(0), 0, 0)] == [b"kept"]
    assert zk_client.exists(root) is None


def test_a_kept_plaintext_cluster_is_not_resumed_with_credentials_it_never_had(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_root: str, tmp_path: Path
) -> None:
    """A work directory kept from a plaintext cluster (made with the opt-out, or by an earlier
    default) says how to start it, instead of servers refusing its open znodes one by one."""

    def make(security: SecurityOptions | None) -> LocalCluster:
        return LocalCluster(
            storages=1,
            servers=1,
            partitions=1,
            zookeeper=zookeeper.connect_string,
            root=zk_root,
            work_dir=tmp_path,
            security=security,
        )

    with make(SecurityOptions.plaintext()) as first:
        assert first.certificates is None and first.zookeeper_digest_file is None
        assert append(first, first.owner(0), 0, 1, b"plaintext") == 0
    with pytest.raises(ConfigurationError, match=r"made without ZooKeeper credentials .* --insecure"):
        make(None).start()
    with make(SecurityOptions.plaintext()) as again:
        assert [r.data for r in read(again, again.owner(0), 0, 0)] == [b"plaintext"]


def test_a_zookeeper_given_at_a_wrong_address_fails_the_start_before_any_node_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``zookeeper=`` pointing where nothing answers, the start fails in the external
    ZooKeeper's short wait (2 s here), not the start timeout (120 s), naming the address, and no
    node was started for nothing."""
    monkeypatch.setattr(local_cluster, "EXTERNAL_ZOOKEEPER_WAIT", 2.0)
    cluster = LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper="127.0.0.1:1",
        work_dir=tmp_path / "cluster",
        processes=ProcessOptions(start_timeout=120.0),
    )
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailableError, match=r"127\.0\.0\.1:1 answered within 2s"):
        cluster.start()
    assert time.monotonic() - started < 60
    assert not list((tmp_path / "cluster").glob("storage-*")), list((tmp_path / "cluster").iterdir())
