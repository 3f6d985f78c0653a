"""Fault test with a TCP proxy of our own between the clients and the server (like upstream's).

The server advertises the proxy's address, so every client connection goes through it; the proxy
cuts all connections at random points while two clients append. Invariants: every transaction
committed exactly once, both clients apply the same sequence, each context completes once.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_helpers import Append, MemoryStore
from support.proxy import TcpProxy

from waltz import WaltzClient, WaltzClientConfig
from waltz.services.local_cluster import LocalCluster


@pytest.fixture
def proxied_cluster(tmp_path: Path, zookeeper: object) -> Iterator[tuple[LocalCluster, TcpProxy]]:
    holder: dict[str, LocalCluster] = {}
    proxy = TcpProxy(lambda: ("127.0.0.1", holder["cluster"].servers[0].port))
    local = LocalCluster(
        storages=3,
        servers=1,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
        server_args=["--advertised-endpoint", f"127.0.0.1:{proxy.port}"],
    )
    holder["cluster"] = local
    try:
        with local:
            yield local, proxy
    finally:
        proxy.close()


def test_proxy_cuts_connections_during_1000_transactions(
    proxied_cluster: tuple[LocalCluster, TcpProxy],
) -> None:
    local, proxy = proxied_cluster
    config = WaltzClientConfig(
        zookeeper_connect_string=local.zookeeper_connect_string, cluster_root=local.root
    )
    start = {0: -1, 1: -1}
    stores = [MemoryStore(start), MemoryStore(start)]
    rng = random.Random(11)
    per_client = 500
    with WaltzClient(stores[0], config) as first, WaltzClient(stores[1], config) as second:
        clients = [first, second]
        submitted: list[tuple[Append, object]] = []
        done = threading.Event()

        def cutter() -> None:
            while not done.wait(rng.uniform(0.02, 0.15)):
                proxy.cut()

        def run(client: WaltzClient) -> None:
            for begin in range(0, per_client, 10):
                group = []
                for i in range(begin, begin + 10):
                    context = Append(i % 2, f"{client.client_id}/{i}".encode())
                    group.append(client.submit(context))
                    submitted.append((context, group[-1]))
                for future in group:
                    future.result(120)

        chaos = threading.Thread(target=cutter)
        chaos.start()
        try:
            threads = [threading.Thread(target=run, args=(c,)) for c in clients]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            ids = [future.result(120) for _, future in submitted]  # type: ignore[attr-defined]
        finally:
            done.set()
            chaos.join(10)
        assert proxy.cuts > 3 and proxy.connections > 3, (proxy.cuts, proxy.connections)
        marks = {pid: first.get_high_water_mark(pid) for pid in (0, 1)}
        for client in clients:
            for pid, mark in marks.items():
                assert client.wait_applied(pid, mark, 60), f"client {client.client_id} stuck on {pid}"
    for store in stores:
        assert store.errors == []
    for pid in (0, 1):
        sequences = [[(a.transaction_id, a.data) for a in store.applied[pid]] for store in stores]
        assert sequences[0] == sequences[1]
        assert [t for t, _ in sequences[0]] == list(range(marks[pid] + 1))
    log = {(pid, a.transaction_id): a.data for pid in (0, 1) for a in stores[0].applied[pid]}
    assert len(log) == len(set(log.values())) == len(submitted) == 2 * per_client  # each exactly once
    for (context, _), transaction_id in zip(submitted, ids, strict=True):
        assert transaction_id is not None
        assert log[(context.partition, transaction_id)] == context.data
        assert context.outcomes.completions == [True]
