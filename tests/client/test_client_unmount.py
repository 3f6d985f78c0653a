"""Unmounting a partition (``docs/protocol.md`` "Unmount") against a real local cluster.

When the application drops a partition with ``set_partitions``, the client sends ``UnmountRequest``
and the partition's server stops feeding that partition to the client's connection; mounting it
again restarts the feed from the callbacks' high-water mark.
"""

from __future__ import annotations

import asyncio

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.protocol.server_client import ServerAdminClient

TIMEOUT = 30.0


def mounted_clients(cluster: LocalCluster, endpoint: str, partition_id: int) -> int:
    """The client connections the server at ``endpoint`` feeds ``partition_id`` to (admin status)."""

    async def status() -> int:
        async with ServerAdminClient(endpoint, tls=cluster.admin_tls, timeout=5) as admin:
            response = await admin.status()
        [state] = [p for p in response.partitions if p.partition_id == partition_id]
        return state.mounted_clients

    return asyncio.run(status())


def test_unmounted_partition_is_no_longer_fed_and_mounting_it_again_applies_what_was_missed(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    other_store = MemoryStore(log_start)
    config = client_config.model_copy(update={"client_auto_mount": False})
    owner = cluster.wait_ready(TIMEOUT)[0].endpoint
    with WaltzClient(store, config) as client:
        client.set_partitions({0, 1})
        client.wait_mounted(TIMEOUT)
        mounted = mounted_clients(cluster, owner, 0)
        assert mounted >= 1, f"the server of partition 0 ({owner}) counts no mounted client"

        client.set_partitions({1})
        assert client.mounted_partitions() == [1]
        wait_until(
            lambda: mounted_clients(cluster, owner, 0) <= mounted - 1,
            timeout=TIMEOUT,
            what=f"the server of partition 0 ({owner}) to stop counting the unmounted client (was {mounted})",
        )

        with WaltzClient(other_store, client_config) as other:
            ids = [
                other.submit(Append(0, f"missed {i}".encode(), header=i)).result(TIMEOUT).transaction_id
                for i in range(20)
            ]
            last = ids[-1]
            assert last is not None and ids == list(range(log_start[0] + 1, last + 1))
            # A later transaction on partition 1, which the client still follows: once it is
            # applied, feed entries of partition 0 sent to the client would have arrived too.
            marker = other.submit(Append(1, b"marker")).result(TIMEOUT).transaction_id
            assert marker is not None
            wait_until(
                lambda: store.get_client_high_water_mark(1) >= marker,
                timeout=TIMEOUT,
                what=f"the client to apply transaction {marker} of partition 1 (at {store.marks})",
            )
        assert store.calls[0] == [], "the client applied transactions of a partition it unmounted"
        assert store.get_client_high_water_mark(0) == log_start[0]

        client.set_partitions({0, 1})
        client.wait_mounted(TIMEOUT)
        wait_until(
            lambda: store.get_client_high_water_mark(0) >= last,
            timeout=TIMEOUT,
            what=f"the client to apply partition 0 up to {last} after mounting it again (at {store.marks})",
        )
        assert mounted_clients(cluster, owner, 0) >= 1

    assert store.errors == []
    assert store.calls[0] == ids  # each missed transaction once, in order
    assert [(a.transaction_id, a.data) for a in store.applied[0]] == [
        (tid, f"missed {i}".encode()) for i, tid in enumerate(ids)
    ]
