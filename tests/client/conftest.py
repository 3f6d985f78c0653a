"""Fixtures of the client tests: one local Waltz cluster for the whole session, healed per test.

``cluster`` (function) undoes what earlier tests did (restarts killed servers, waits until every
partition is writable) and ``log_start`` gives each partition's current high-water mark, so that a
test's in-memory store starts where the shared log is now.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import support

from waltz import WaltzClientConfig
from waltz.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def client_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """ZooKeeper (the session's), 3 storage nodes, 2 servers, 2 partitions; the nodes serve metrics."""
    with support.session_cluster(
        tmp_path_factory, zookeeper, name="client", partitions=2, metrics=True
    ) as local:
        yield local


@pytest.fixture
def cluster(request: pytest.FixtureRequest, client_cluster: LocalCluster) -> LocalCluster:
    """The session's cluster with every process running and every partition writable."""
    return support.healed_cluster(request, client_cluster)


@pytest.fixture
def log_start(cluster: LocalCluster) -> dict[int, int]:
    """Partition -> its high-water mark now (a test's store starts there)."""
    return {pid: owner.high_water_mark for pid, owner in cluster.wait_ready(30).items()}


@pytest.fixture
def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    """A client configuration for the cluster."""
    return WaltzClientConfig(
        **cluster.client_settings(),
        zookeeper_session_timeout=10.0,
    )
