"""Unmounting a partition (``docs/protocol.md`` "Unmount") against a real local cluster.

When the application drops a partition with ``set_partitions``, the client sends ``UnmountRequest``
and the partition's server stops feeding that partition to the client's connection; mounting it
again restarts the feed from the callbacks' high-water mark.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import Transaction, WaltzClient, WaltzClientConfig
from waltz.client import core
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


class HeldFirstApply(MemoryStore):
    """Applies as :class:`MemoryStore`, the first transaction only after ``hold`` seconds; notes
    each transaction handed to ``apply_transaction`` and the most applies that ran at once."""

    def __init__(self, start: dict[int, int], hold: float) -> None:
        super().__init__(start)
        self.hold = hold
        self.holding = threading.Event()
        self.handed: list[int] = []
        self.running = 0
        self.most_at_once = 0

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.lock:
            self.handed.append(transaction.transaction_id)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            first = not self.holding.is_set()
            self.holding.set()
        try:
            if first:
                time.sleep(self.hold)
            super().apply_transaction(transaction)
        finally:
            with self.lock:
                self.running -= 1


def test_a_partition_mounted_again_while_its_unmounted_apply_runs_on_applies_each_transaction_once(
    cluster: LocalCluster,
    client_config: WaltzClientConfig,
    log_start: dict[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``set_partitions`` waits a while for the apply in progress of a partition it unmounts, then
    returns with that apply still running. Mounting the partition again meanwhile must not start a
    second apply beside it: the mount waits until that apply returned, then mounts from the mark
    it left, so the transaction is applied once, never by two threads at once."""
    monkeypatch.setattr(core, "UNMOUNT_APPLY_WAIT", 0.5)  # set_partitions' wait, shortened
    store = HeldFirstApply(log_start, hold=4.0)
    config = client_config.model_copy(update={"client_auto_mount": False})
    with WaltzClient(store, config) as client:
        client.set_partitions({0})
        client.wait_mounted(TIMEOUT)
        with WaltzClient(MemoryStore(log_start), client_config) as writer:
            first = writer.submit(Append(0, b"held")).result(TIMEOUT).transaction_id
            assert first is not None
            assert store.holding.wait(TIMEOUT), "the client never applied the transaction"
            started = time.monotonic()
            client.set_partitions(set())
            assert time.monotonic() - started < 3.0, "set_partitions waited for the whole apply"
            assert store.running == 1  # the apply goes on behind the unmount
            client.set_partitions({0})
            client.wait_mounted(TIMEOUT)
            second = writer.submit(Append(0, b"after")).result(TIMEOUT).transaction_id
            assert second is not None
        assert client.wait_applied(0, second, TIMEOUT)
    assert store.most_at_once == 1, f"two applies of partition 0 ran at once: {store.handed}"
    assert store.handed == [first, second], "a transaction was handed to apply_transaction twice"
    assert store.errors == []
