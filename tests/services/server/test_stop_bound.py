"""A server stops within its bound after SIGTERM, whatever ZooKeeper does at the same moment.

docs/design/server.md, "Stopping within a bound".
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from support.storage import run

from tests.services.server.conftest import StoreCluster, make_store_cluster
from tests.services.server.test_server_process import wait_writable_owner
from waltz.local.nodes import LocalServer, LocalStorageNode
from waltz.local.options import DEFAULT_SERVER_ENV
from waltz.local.processes import wait_until
from waltz.local.zookeeper import LocalZooKeeper
from waltz.services.runtime import STOP_BOUND

SESSION_TIMEOUT = 4.0
ROUNDS = 5


@pytest.fixture
def private_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, private_zookeeper: LocalZooKeeper
) -> Iterator[StoreCluster]:
    """One storage node and a one-partition cluster on a ZooKeeper the test may stop."""
    client = KazooClient(hosts=private_zookeeper.connect_string)
    client.start(timeout=10)
    try:
        yield from make_store_cluster(
            request, tmp_path, client, "/waltz/stop-bound", storages=1, partitions=1
        )
    finally:
        client.stop()
        client.close()


def sigterm_together(server: LocalServer, storage: LocalStorageNode, zookeeper: LocalZooKeeper) -> float:
    """SIGTERM the server, the storage node and ZooKeeper at the same moment; the seconds until
    both Waltz processes exited (each must exit with status 0: a graceful stop, not the watchdog's)."""
    pids = [p.pid for p in (server.process, storage.process, zookeeper.process)]
    assert None not in pids
    started = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)  # type: ignore[arg-type]
    for node in (server, storage):
        try:
            returncode = node.process.wait(STOP_BOUND + 5)
        except TimeoutError:
            pytest.fail(
                f"{node.process.name} still ran {STOP_BOUND + 5:.0f}s after SIGTERM (ZooKeeper stopping too)"
            )
        assert returncode == 0, f"{node.process.name} exited with {returncode}: {node.process.log_tail()}"
    return time.monotonic() - started


def test_a_server_exits_within_the_bound_when_zookeeper_stops_with_it(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    private_zookeeper: LocalZooKeeper,
    private_cluster: StoreCluster,
) -> None:
    (storage,) = private_cluster.storages
    exits: list[float] = []
    for attempt in range(ROUNDS):
        if not private_zookeeper.is_running():
            private_zookeeper.start()
        if not storage.process.is_running():
            storage.start()
        name = f"server-{attempt}"
        server = LocalServer(
            private_zookeeper.connect_string,
            "/waltz/stop-bound",
            name=name,
            log_path=tmp_path / f"{name}.log",
            session_timeout=SESSION_TIMEOUT,
            env=dict(DEFAULT_SERVER_ENV),
            insecure=True,
        )
        support.add_failure_logs(request.node, f"{name} log", server.process.log_tail)
        with server:
            run(wait_writable_owner(private_cluster, timeout=30))
            exits.append(sigterm_together(server, storage, private_zookeeper))
        private_zookeeper.process.wait(30)
    print(f"exit times after SIGTERM: {exits}")
    assert max(exits) < STOP_BOUND, f"exit times after SIGTERM: {exits}"


def test_a_server_cut_off_from_zookeeper_exits_within_the_bound(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    private_zookeeper: LocalZooKeeper,
    private_cluster: StoreCluster,
) -> None:
    server = LocalServer(
        private_zookeeper.connect_string,
        "/waltz/stop-bound",
        name="server",
        log_path=tmp_path / "server.log",
        session_timeout=SESSION_TIMEOUT,
        env=dict(DEFAULT_SERVER_ENV),
        insecure=True,
    )
    support.add_failure_logs(request.node, "server log", server.process.log_tail)
    with server:
        run(wait_writable_owner(private_cluster, timeout=30))
        private_zookeeper.kill()  # gone, as a crash: the server's calls wait for it to come back
        wait_until(
            lambda: "Zookeeper connection lost" in server.process.log_tail(200),
            timeout=30,
            what="the server to see its ZooKeeper connection lost",
        )
        pid = server.process.pid
        assert pid is not None
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        returncode = server.process.wait(STOP_BOUND + 5)
        elapsed = time.monotonic() - started
    assert returncode == 0, server.process.log_tail()
    assert elapsed < STOP_BOUND, f"exited {elapsed:.1f}s after SIGTERM"
