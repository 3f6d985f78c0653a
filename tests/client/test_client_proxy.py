"""Fault test with our TCP fault proxy (``waltz.chaos.proxy``) between clients and server, like upstream.

The server advertises the proxy's address, so every client connection goes through it; the proxy
cuts all connections at random points while two clients append. Invariants: every transaction
committed exactly once, both clients apply the same sequence, each context completes once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.client_helpers import run_with_cuts
from waltz import WaltzClientConfig
from waltz.chaos.proxy import FaultProxy
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions


@pytest.fixture
def proxied_cluster(tmp_path: Path, zookeeper: object) -> Iterator[tuple[LocalCluster, FaultProxy]]:
    holder: dict[str, LocalCluster] = {}
    proxy = FaultProxy(lambda: ("127.0.0.1", holder["cluster"].servers[0].port), name="server-0")
    local = LocalCluster(
        storages=3,
        servers=1,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "cluster",
        delete_root=True,
        processes=ProcessOptions(server_args=["--advertised-endpoint", f"127.0.0.1:{proxy.port}"]),
    )
    holder["cluster"] = local
    try:
        with local:
            yield local, proxy
    finally:
        proxy.close()


def test_proxy_cuts_connections_during_1000_transactions(
    proxied_cluster: tuple[LocalCluster, FaultProxy],
) -> None:
    local, proxy = proxied_cluster
    config = WaltzClientConfig(**local.client_settings())
    run_with_cuts(config, {0: -1, 1: -1}, per_client=500, cut=lambda clients, rng: proxy.cut())
    assert proxy.cuts > 3 and proxy.connections > 3, (proxy.cuts, proxy.connections)
