"""Fixtures of the client tests: one local Waltz cluster for the whole session, healed per test.

``cluster`` (function) undoes what earlier tests did (restarts killed servers, waits until every
partition is writable) and ``log_start`` gives each partition's current high-water mark, so that a
test's in-memory store starts where the shared log is now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import support

from waltz import WaltzClientConfig
from waltz.services.local_cluster import LocalCluster


@pytest.fixture(scope="session")
def client_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions."""
    with LocalCluster(
        storages=3,
        servers=2,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("client-cluster"),
        delete_root=True,
    ) as local:
        yield local


def _server_logs(cluster: LocalCluster) -> Callable[[], str]:
    def logs() -> str:
        parts = []
        for i, server in enumerate(cluster.servers):
            parts.append(f"--- server {i} ({server.endpoint}) ---\n{server.process.log_tail(40)}")
        return "\n".join(parts)

    return logs


@pytest.fixture
def cluster(request: pytest.FixtureRequest, client_cluster: LocalCluster) -> LocalCluster:
    """The session's cluster with every process running and every partition writable."""
    client_cluster.heal(timeout=60)
    support.add_failure_logs(request.node, "server logs", _server_logs(client_cluster))
    return client_cluster


@pytest.fixture
def log_start(cluster: LocalCluster) -> dict[int, int]:
    """Partition -> its high-water mark now (a test's store starts there)."""
    return {pid: owner.high_water_mark for pid, owner in cluster.wait_ready(30).items()}


@pytest.fixture
def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    """A client configuration for the cluster."""
    return WaltzClientConfig(
        zookeeper_connect_string=cluster.zookeeper_connect_string,
        cluster_root=cluster.root,
        zookeeper_session_timeout=10.0,
    )
