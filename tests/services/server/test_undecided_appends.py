"""An append whose fate is undecided when its owner is fenced: the client learns it from the new owner.

docs/design/server.md "Generations and server fencing": an old owner whose next store session is
refused by a newer generation holds appends that reached only some replicas. The new owner's
recovery may still commit them (catching the other replicas up from the most advanced one,
docs/design/recovery.md "Undecidable high-water mark"), so the old owner must not answer a
waiting flush with its old high-water mark: a client takes that answer for "failed" and runs the
context again, and a transaction without locks is then committed twice.

The scenario, step by step, against real processes (ZooKeeper, three storage nodes behind fault
proxies, two servers, a ``WaltzClient`` and a raw protocol stream):

1. a newer generation takes a store session ID in ZooKeeper, as the partition's next owner does
   first (the old owner keeps writing: it reads the generation only when a session starts);
2. the links from the servers to storage nodes B and C hold every byte, so the next appends (one
   from the client, one from the raw stream) reach only storage node A, and wait for a quorum;
3. both clients send a flush to the old owner, which waits for those appends;
4. the links to B and C are cut: the old owner's store session ends, its next one is refused by
   the newer generation (the fence);
5. the partition is placed on the second server under that generation; its recovery finds the
   appends on A only, with B unreachable: undecidable, until C is reachable again and caught up
   from A. Both appends are committed.

The client must see its append committed once, without running its context again; the old
owner must suspend its feeds and leave the flushes unanswered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import support
from kazoo.client import KazooClient
from support.feed import FeedEntry
from support.storage import run

from tests.client.client_helpers import Append, MemoryStore
from tests.services.server.test_client_protocol import RawClient, kind_of
from waltz import WaltzClient, WaltzClientConfig
from waltz.chaos.proxy import ClusterProxies
from waltz.local.cluster import LocalCluster
from waltz.local.options import NetworkOptions
from waltz.metadata.assignment import PartitionAssignment, Placement, read_assignment
from waltz.metadata.zk import ClusterPaths, ClusterZk
from waltz.protocol import client_pb2
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient

T = TypeVar("T")

#: Seconds the links to the held storage nodes keep every byte (the scenario cuts them long before).
HOLD = 600.0


@pytest.fixture
def fenced_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, zookeeper: object
) -> Iterator[tuple[LocalCluster, ClusterProxies]]:
    """Three storage nodes behind fault proxies, two servers, one partition."""
    with ClusterProxies(2, 3, enabled=True) as proxies:
        cluster = LocalCluster(
            security=support.PLAINTEXT,
            storages=3,
            servers=2,
            partitions=1,
            name="undecided",
            zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
            work_dir=tmp_path / "cluster",
            delete_root=True,
            network=NetworkOptions(storage_connect_string_of=proxies.storage_connect_string),
        )
        proxies.cluster = cluster
        with cluster:
            support.add_failure_logs(
                request.node,
                "server logs",
                lambda: "\n".join(
                    f"--- {s.process.name} ({s.endpoint}) ---\n{s.process.log_tail(60)}"
                    for s in cluster.servers
                ),
            )
            yield cluster, proxies


async def eventually(check: Callable[[], Awaitable[T | None]], what: str, timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something other than None; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


def move_partition(zk: KazooClient, paths: ClusterPaths, member: str, endpoint: str, generation: int) -> None:
    """Place partition 0 on ``member`` under ``generation``, as the cluster manager would."""
    assignment, version = read_assignment(zk, paths)
    placements = dict(assignment.placements)
    placements[0] = Placement(member, endpoint, generation)
    zk.set(paths.server_assignment, PartitionAssignment(placements).encode(), version=version)


def sample(client: WaltzClient, name: str) -> float:
    return client.metrics.get_sample_value(name, {"partition": "0"}) or 0.0


def test_an_undecided_append_is_learnt_from_the_new_owner_and_never_run_twice(
    fenced_cluster: tuple[LocalCluster, ClusterProxies], zk_client: KazooClient
) -> None:
    cluster, proxies = fenced_cluster
    paths = ClusterPaths.of(cluster.root)
    old_index = cluster.owner_index(0)
    new_index = 1 - old_index
    old, new = cluster.servers[old_index], cluster.servers[new_index]
    generation = cluster.wait_ready(30)[0].generation
    _, b, c = proxies.storages  # the links to storage nodes B and C (A's is never touched)
    storage_a = cluster.storages[0]

    async def max_on_a() -> int:
        async with StorageAdminClient(storage_a.admin_address, cluster.cluster_key, 1) as admin:
            return await admin.max_transaction_id(0)

    start = cluster.wait_ready(30)[0].high_water_mark
    store = MemoryStore({0: start})
    config = WaltzClientConfig(
        **cluster.client_settings(),
        zookeeper_session_timeout=10.0,
    )
    undecided = Append(0, b"undecided, and without locks")

    async def scenario(client: WaltzClient) -> tuple[list[str], int]:
        raw = RawClient(old.endpoint, 9_001, generation)
        reader: RawClient | None = None
        try:
            raw.mount(start)
            assert (await raw.next("mount")).mount.partition_ready

            # 1. A newer generation takes a store session ID (the new owner's first step).
            await asyncio.to_thread(ClusterZk(zk_client, cluster.root).begin_store_session, 0, generation + 1)

            # 2. Appends reach storage node A only.
            b.set_delay(HOLD)
            c.set_delay(HOLD)
            future = await asyncio.to_thread(client.submit, undecided)
            raw_append = raw.append(start, b"undecided too, from the raw stream")
            # 3. Flushes wait on the old owner: the raw stream's, then the client's. The answer to
            # a high-water-mark request sent after the client's flush shows it reached the server.
            raw.outgoing.put_nowait(
                client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=raw.req_id()))
            )

            async def both_on_a() -> bool | None:
                return await max_on_a() >= start + 2 or None

            await eventually(both_on_a, "both appends on storage node A", timeout=20)
            client._core.nudge([0])
            assert await asyncio.to_thread(client.get_high_water_mark, 0, 10) == start
            assert not future.done(), "committed without a quorum"

            # 4. The old owner's store session ends; its next one is fenced.
            remounts = sample(client, "waltz_client_remounts_total")
            failed = sample(client, "waltz_client_failed_appends_total")
            b.block()
            c.block()
            seen: list[str] = []
            while True:
                item = await asyncio.wait_for(raw.incoming.get(), 30)
                kind = kind_of(item)
                if kind == "flush":
                    assert not isinstance(item, FeedEntry)
                    seen.append(f"flush answered with high-water mark {item.flush.transaction_id}")
                elif kind == "feed_suspended":
                    seen.append("feed suspended")
                if seen:
                    break

            async def client_moved_on() -> bool | None:
                return (
                    sample(client, "waltz_client_remounts_total") > remounts
                    or sample(client, "waltz_client_failed_appends_total") > failed
                    or undecided.outcomes.executions > 1
                    or None
                )

            await eventually(client_moved_on, "the client to act on the old owner's answer")

            # 5. The partition moves to the other server under the newer generation; its recovery
            # commits both appends once C is reachable again and caught up from A.
            async with ServerAdminClient(new.endpoint, timeout=10) as admin:
                member = (await admin.status()).member
            await asyncio.to_thread(move_partition, zk_client, paths, member, new.endpoint, generation + 1)
            c.set_delay(0.0)
            c.unblock()
            committed = (await asyncio.wait_for(asyncio.wrap_future(future), 60)).transaction_id
            assert committed is not None
            b.set_delay(0.0)
            b.unblock()
            await asyncio.to_thread(client.flush, 60)

            # The new owner's log from the old mark on.
            reader = RawClient(new.endpoint, 9_002, generation + 1)
            reader.mount(start)
            logged: list[tuple[int, int, int]] = []
            while True:
                item = await asyncio.wait_for(reader.incoming.get(), 30)
                if kind_of(item) == "mount":
                    break
                if kind_of(item) == "feed":
                    assert isinstance(item, FeedEntry)
                    logged.append((item.transaction_id, item.req_id.client_id, item.req_id.seq_num))
            raw_ids = [
                tid for tid, client_id, seq in logged if (client_id, seq) == (9_001, raw_append.seq_num)
            ]
            assert len(raw_ids) == 1, f"the raw stream's undecided append in the new owner's log: {logged}"
            # Anything the old owner sent later on the raw stream.
            while not raw.incoming.empty():
                item = raw.incoming.get_nowait()
                if kind_of(item) == "flush":
                    assert not isinstance(item, FeedEntry)
                    seen.append(f"flush answered with high-water mark {item.flush.transaction_id}")
            return seen, committed
        finally:
            await raw.close()
            if reader is not None:
                await reader.close()

    with WaltzClient(store, config) as client:
        client.wait_mounted(30)
        seen, committed = run(scenario(client))
        # A context completes when the feed shows its commit; the apply follows on the worker.
        assert client.wait_applied(0, committed, 30), f"transaction {committed} not applied in 30 s"
        applied = list(store.applied[0])
    mine = [t.transaction_id for t in applied if t.data == undecided.data]
    assert mine == [committed] and undecided.outcomes.executions == 1, (
        f"the append is in the log at {mine} (acknowledged as {committed}), its context ran "
        f"{undecided.outcomes.executions} times: the client took the old owner's answer ({seen}) "
        "for a failure, although the new owner committed the append"
    )
    assert undecided.outcomes.completions == [True]
    assert seen == ["feed suspended"], f"the fenced old owner sent: {seen}"
    assert not store.errors
