"""The console's look at ZooKeeper, against the session's real ZooKeeper (docs/design/console.md
"ZooKeeper health")."""

from __future__ import annotations

import asyncio

from kazoo.client import KazooClient

from waltz.console.zookeeper_health import probe_ensemble
from waltz.local.processes import free_port
from waltz.local.zookeeper import DockerZooKeeper, LocalZooKeeper


def test_each_server_of_the_connect_string_is_asked(
    zookeeper: LocalZooKeeper | DockerZooKeeper, zk_client: KazooClient
) -> None:
    health = asyncio.run(probe_ensemble(zk_client, zookeeper.connect_string, "/", timeout=5))
    assert health.session_state == "CONNECTED"
    assert health.round_trip_ms is not None and health.round_trip_ms >= 0
    (server,) = health.servers
    assert server.reachable and server.mode == "standalone", server
    assert server.connections is not None and server.connections >= 1
    assert health.healthy

    # A second server that does not answer: one of two is no majority.
    down = f"127.0.0.1:{free_port()}"
    health = asyncio.run(probe_ensemble(zk_client, f"{zookeeper.connect_string},{down}", "/", timeout=2))
    assert [s.reachable for s in health.servers] == [True, False]
    assert health.servers[1].error is not None
    assert not health.healthy
