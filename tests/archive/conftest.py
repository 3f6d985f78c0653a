"""Fixtures of the archive tests: one real local cluster for the package, written by a client.

- ``archive_cluster`` (package): ZooKeeper (the session's), 3 storage nodes, 1 server, 2 partitions.
- ``cluster``: it with every process running (earlier tests may have stopped some).
- ``archive_zk``: a :class:`ClusterZk` on its ZooKeeper, the archive's summary deleted first: each
  test archives to a location of its own, as a cluster's first run does.
- ``location``: an empty directory for the test's archive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from kazoo.exceptions import NoNodeError

from waltz.local.cluster import LocalCluster
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper


@pytest.fixture(scope="package")
def archive_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=2,
        name="archive",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("archive-cluster"),
        delete_root=True,
    ) as local:
        local.wait_ready(60)
        yield local


@pytest.fixture
def cluster(request: pytest.FixtureRequest, archive_cluster: LocalCluster) -> LocalCluster:
    return support.healed_cluster(request, archive_cluster)


@pytest.fixture
def archive_zk(cluster: LocalCluster) -> Iterator[ClusterZk]:
    zk = connect_zookeeper(cluster.zookeeper_connect_string, security=cluster.zookeeper_security)
    try:
        cluster_zk = ClusterZk(zk, cluster.root)
        with contextlib.suppress(NoNodeError):
            zk.delete(cluster_zk.paths.archive)
        yield cluster_zk
    finally:
        zk.stop()
        zk.close()


@pytest.fixture
def location(tmp_path: Path) -> Path:
    return tmp_path / "archive"
