"""Connecting to ZooKeeper with a time limit: what a wrong address or a wrong root says, and kazoo's
own warnings held back only while the first connection is awaited (docs/design/zookeeper.md
"Connecting")."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from waltz.errors import ClusterNotFoundError
from waltz.local.processes import free_port
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_security import ZooKeeperSecurity
from waltz.metadata.zk_session import ZooKeeperUnavailableError, connect_zookeeper


def _kazoo_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    records = caplog.records
    return [r.getMessage() for r in records if r.name.startswith("kazoo") and r.levelno >= logging.WARNING]


def test_a_port_where_nothing_listens_fails_with_the_cause_and_without_kazoo_s_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="kazoo")
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(ZooKeeperUnavailableError) as raised:
        connect_zookeeper(address, connect_timeout=2.0)
    message = str(raised.value)
    assert f"no ZooKeeper server at {address} answered within 2s" in message
    assert "Connection refused" in message and "check the ZooKeeper connect string (--zookeeper" in message
    assert _kazoo_warnings(caplog) == []
    # the attempts are still there for whoever turns DEBUG on
    assert any("Connection dropped" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_an_unknown_host_names_the_resolution_failure() -> None:
    with pytest.raises(ZooKeeperUnavailableError, match=r"Cannot resolve no-such-host\.invalid"):
        connect_zookeeper("no-such-host.invalid:2181", connect_timeout=1.0)


def test_once_connected_a_dropped_connection_is_still_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kazoo")
    with LocalZooKeeper(data_dir=tmp_path / "zk", tick_time_ms=500) as zookeeper:
        client = connect_zookeeper(zookeeper.connect_string, connect_timeout=10.0)
        try:
            assert _kazoo_warnings(caplog) == []
            zookeeper.kill()
            deadline = time.monotonic() + 10.0
            while not _kazoo_warnings(caplog) and time.monotonic() < deadline:
                time.sleep(0.05)
            warnings = _kazoo_warnings(caplog)
            assert any("Connection dropped" in m or "Transition to CONNECTING" in m for m in warnings)
        finally:
            client.stop()
            client.close()


def test_a_root_with_no_cluster_names_the_clusters_beside_it(zk_client: KazooClient, zk_root: str) -> None:
    """A typo in the root is the usual cause: the error names the roots beside it that hold a
    cluster, and where the root is set, rather than only suggesting to create one."""
    zk_client.create(f"{zk_root}/local/cluster", b"{}", makepath=True)
    with pytest.raises(ClusterNotFoundError) as raised:
        ClusterZk(zk_client, f"{zk_root}/locl").params()
    message = str(raised.value)
    assert f"no cluster under {zk_root}/locl (clusters beside it: {zk_root}/local)" in message
    assert "--root, WALTZ_CLUSTER_ROOT, cluster.root" in message
    zk_client.delete(f"{zk_root}/local", recursive=True)
    zk_client.create(f"{zk_root}/other", b"", makepath=True)
    with pytest.raises(ClusterNotFoundError) as alone:
        ClusterZk(zk_client, f"{zk_root}/locl").params()
    assert f"no cluster under {zk_root}/locl (no cluster beside it in {zk_root})" in str(alone.value)
    with pytest.raises(ClusterNotFoundError) as nothing_near:
        ClusterZk(zk_client, f"{zk_root}/x/y").params()
    # a parent that does not exist (or may not be read): nothing is said of what is beside it
    assert f"no cluster under {zk_root}/x/y: check the cluster root" in str(nothing_near.value)


def test_securing_a_root_with_no_cluster_names_the_clusters_beside_it(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_client: KazooClient, zk_root: str
) -> None:
    """``waltz cluster secure`` on a mistyped root gives the same hint as every read of it."""
    zk_client.create(f"{zk_root}/local/cluster", b"{}", makepath=True)
    operator = connect_zookeeper(zookeeper.connect_string, security=ZooKeeperSecurity("operator:s3cret"))
    try:
        with pytest.raises(ClusterNotFoundError) as raised:
            ClusterZk(operator, f"{zk_root}/locl").access.secure()
    finally:
        operator.stop()
        operator.close()
    message = str(raised.value)
    assert f"no cluster under {zk_root}/locl (clusters beside it: {zk_root}/local)" in message
    assert "--root, WALTZ_CLUSTER_ROOT, cluster.root" in message
