"""A partition's owner refuses appends routed by an epoch below its partition's, from
``partitions/epochs`` (docs/design/splits.md "The handover", step 3; "Why no update is lost").

Real storage and server processes and a real ZooKeeper: the test writes the epochs znode as a
split's steps do (prepare, mark a parent sealing), and raw protocol clients send appends with the
epoch they were routed by (``docs/protocol.md`` "Partition epochs"). A restarted server reads the
znode after its recovery and before its first append; a running one follows it by a watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import support
from kazoo.client import KazooClient
from support.feed import FeedEntry
from support.storage import run

from tests.client.client_helpers import Append, MemoryStore
from tests.services.server.test_client_protocol import RawClient, kind_of
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.metadata.epochs import PartitionEpochsZk
from waltz.metadata.paths import ClusterPaths
from waltz.protocol import client_pb2, common_pb2
from waltz.protocol.records import crc32

#: What a refusal of an epoch-0 append to partition 0, sealing for epoch 1 (2 -> 4), says.
STALE = "takes only appends routed by epoch 1 (4 partitions) or later, and this one was routed by epoch 0"
#: Appends sent at most while waiting for a server's watch to close the gate.
WATCH_ATTEMPTS = 200


class PartitionClient(RawClient):
    """A raw protocol client of one partition that says which epoch it routed each append by."""

    def __init__(self, endpoint: str, client_id: int, generation: int, partition_id: int) -> None:
        super().__init__(endpoint, client_id, generation)
        self.partition_id = partition_id
        self.mark = -1  # the client high-water mark its appends carry: the last mount's

    async def mount_at_high_water_mark(self) -> int:
        self.mark = await super().mount_at_high_water_mark()
        return self.mark

    def req_id(self, generation: int | None = None) -> common_pb2.ReqId:
        req_id = super().req_id(generation)
        req_id.partition_id = self.partition_id
        return req_id

    def append_by(
        self, epoch: int, data: bytes, write: Sequence[int] = (), append: Sequence[int] = ()
    ) -> common_pb2.ReqId:
        """An ``AppendRequest`` routed by ``epoch``, with the high-water mark of the last mount (a
        sealing parent's log holds its barrier: a WRITE lock is checked against it)."""
        req_id = self.req_id()
        self.outgoing.put_nowait(
            client_pb2.ClientMessage(
                append=client_pb2.AppendRequest(
                    req_id=req_id,
                    client_high_water_mark=self.mark,
                    write_lock_hashes=list(write),
                    append_lock_hashes=list(append),
                    header=7,
                    data=data,
                    checksum=crc32(data),
                    epoch=epoch,
                )
            )
        )
        return req_id

    def appends_by(self, epoch: int, data: Sequence[bytes]) -> list[int]:
        """One ``AppendRequests`` routed by ``epoch``, a row per data, without locks (blind
        appends); returns the rows' sequence numbers."""
        seq_nums = [self.req_id().seq_num for _ in data]
        self.outgoing.put_nowait(
            client_pb2.ClientMessage(
                appends=client_pb2.AppendRequests(
                    client_id=self.client_id,
                    generation=self.generation,
                    partition_id=self.partition_id,
                    seq_nums=seq_nums,
                    client_high_water_marks=[-1] * len(data),
                    headers=[7] * len(data),
                    data=list(data),
                    checksums=[crc32(d) for d in data],
                    epoch=epoch,
                )
            )
        )
        return seq_nums

    async def outcome(self, seq_num: int) -> FeedEntry | client_pb2.ServerError | client_pb2.LockFailure:
        """The feed entry, the server error or the lock failure of the append ``seq_num`` (others
        skipped)."""
        for _ in range(10_000):
            item = await asyncio.wait_for(self.incoming.get(), 10)
            if isinstance(item, FeedEntry) and item.req_id.seq_num == seq_num:
                return item
            if isinstance(item, FeedEntry):
                continue
            if kind_of(item) == "error" and item.error.req_id.seq_num == seq_num:
                return item.error
            if kind_of(item) == "lock_failure" and item.lock_failure.req_id.seq_num == seq_num:
                return item.lock_failure
        raise AssertionError(f"no outcome of append {seq_num} among 10,000 messages")


def start_cluster(work_dir: Path, zookeeper: object) -> LocalCluster:
    return LocalCluster(
        security=support.PLAINTEXT,
        storages=1,
        servers=1,
        partitions=2,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=work_dir,
        delete_root=True,
    )


def seal_partition_0(cluster: LocalCluster) -> None:
    """Steps 2 and 3 of a split to 4 partitions, as far as marking parent 0 sealing."""
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    try:
        epochs = PartitionEpochsZk(zk, ClusterPaths.of(cluster.root), timeout=30)
        epochs.prepare(4, {0: -1, 1: -1})
        sealed = epochs.mark_sealing(1, 0)
        assert sealed.value.epoch(1).parents[0].sealing and not sealed.value.epoch(1).parents[1].sealing
    finally:
        zk.stop()
        zk.close()


def is_stale_refusal(outcome: FeedEntry | client_pb2.ServerError | client_pb2.LockFailure) -> bool:
    return (
        isinstance(outcome, client_pb2.ServerError)
        and outcome.code == client_pb2.STALE_PARTITION_EPOCH
        and (outcome.epoch, outcome.partition_count) == (1, 4)
        and STALE in outcome.message
    )


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A cluster whose partition 0 is marked sealing for epoch 1 (count 2 -> 4), and whose server
    started again after that: it knows it only from its read after the recovery."""
    with start_cluster(tmp_path_factory.mktemp("epoch-refusals-sealed"), zookeeper) as local:
        local.wait_ready(30)
        seal_partition_0(local)
        local.restart_server(0)
        local.wait_ready(60)
        yield local


def owner(cluster: LocalCluster, partition_id: int) -> tuple[str, int]:
    found = cluster.wait_ready(60)[partition_id]
    return cluster.owner(partition_id), found.generation


def test_a_sealing_parent_refuses_appends_of_epoch_0_with_and_without_locks(sealed: LocalCluster) -> None:
    endpoint, generation = owner(sealed, 0)

    async def scenario() -> None:
        peer = PartitionClient(endpoint, 300, generation, 0)
        try:
            before = await peer.mount_at_high_water_mark()
            locked = peer.append_by(0, b"with a WRITE lock", write=[1])
            assert is_stale_refusal(await peer.outcome(locked.seq_num))
            blind = peer.append_by(0, b"a blind APPEND of a moved key")
            assert is_stale_refusal(await peer.outcome(blind.seq_num))
            shared = peer.append_by(0, b"with an APPEND lock", append=[2])
            assert is_stale_refusal(await peer.outcome(shared.seq_num))
            # Routed by the new epoch: taken, at the next ID (the refused ones took none).
            routed = peer.append_by(1, b"routed by epoch 1", write=[12])
            entry = await peer.outcome(routed.seq_num)
            assert isinstance(entry, FeedEntry) and entry.transaction_id == before + 1
        finally:
            await peer.close()

    run(scenario())


def test_every_row_of_a_stale_appends_message_is_refused(sealed: LocalCluster) -> None:
    endpoint, generation = owner(sealed, 0)

    async def scenario() -> None:
        peer = PartitionClient(endpoint, 400, generation, 0)
        try:
            before = await peer.mount_at_high_water_mark()
            for seq_num in peer.appends_by(0, [b"one", b"two", b"three"]):
                assert is_stale_refusal(await peer.outcome(seq_num))
            rows = peer.appends_by(1, [b"four", b"five"])
            entries = [await peer.outcome(seq_num) for seq_num in rows]
            assert [e.transaction_id for e in entries if isinstance(e, FeedEntry)] == [before + 1, before + 2]
        finally:
            await peer.close()

    run(scenario())


def test_a_parent_not_sealing_takes_appends_of_epoch_0(sealed: LocalCluster) -> None:
    endpoint, generation = owner(sealed, 1)

    async def scenario() -> None:
        peer = PartitionClient(endpoint, 500, generation, 1)
        try:
            before = await peer.mount_at_high_water_mark()
            single = peer.append_by(0, b"epoch 0, partition 1", write=[11])
            entry = await peer.outcome(single.seq_num)
            assert isinstance(entry, FeedEntry) and entry.transaction_id == before + 1
            rows = peer.appends_by(0, [b"a", b"b"])
            entries = [await peer.outcome(seq_num) for seq_num in rows]
            assert [e.transaction_id for e in entries if isinstance(e, FeedEntry)] == [before + 2, before + 3]
        finally:
            await peer.close()

    run(scenario())


def test_the_client_routes_a_context_of_a_sealing_parent_by_its_epoch(sealed: LocalCluster) -> None:
    # The client reads the epochs too (docs/design/splits.md "Clients across a split"): a
    # context of parent 0 goes with epoch 1 and is taken at once, one of parent 1 with epoch 0.
    owners = sealed.wait_ready(60)
    store = MemoryStore({pid: found.high_water_mark for pid, found in owners.items()})
    config = WaltzClientConfig(**sealed.client_settings(), zookeeper_session_timeout=10.0)
    with WaltzClient(store, config) as client:
        routed = Append(0, b"routed by epoch 1", once=True)
        assert client.submit(routed).result(30).partition_id == 0
        committed = client.submit(Append(1, b"partition 1 is not sealing")).result(30)
    assert routed.outcomes.executions == 1 and routed.outcomes.completions == [True]
    assert committed.transaction_id == owners[1].high_water_mark + 1


def test_without_an_epochs_znode_appends_of_every_epoch_are_taken_and_the_gate_follows_the_znode(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> None:
    with start_cluster(tmp_path_factory.mktemp("epoch-refusals-watch"), zookeeper) as cluster:
        endpoint, generation = owner(cluster, 0)

        async def before_the_split() -> None:
            peer = PartitionClient(endpoint, 600, generation, 0)
            try:
                before = await peer.mount_at_high_water_mark()
                for offset, epoch in enumerate((0, 1, 0), start=1):
                    sent = peer.append_by(epoch, b"no split yet", write=[offset])
                    entry = await peer.outcome(sent.seq_num)
                    assert isinstance(entry, FeedEntry) and entry.transaction_id == before + offset
            finally:
                await peer.close()

        run(before_the_split())
        seal_partition_0(cluster)  # after the server started: only its watch tells it

        async def after_the_split() -> None:
            peer = PartitionClient(endpoint, 700, generation, 0)
            try:
                await peer.mount_at_high_water_mark()
                outcomes = []
                for attempt in range(WATCH_ATTEMPTS):  # until the watch has closed the gate
                    sent = peer.append_by(0, b"epoch 0 while the watch fires", write=[100 + attempt])
                    outcomes.append(await peer.outcome(sent.seq_num))
                    if not isinstance(outcomes[-1], FeedEntry):
                        break
                    await asyncio.sleep(0.05)
                assert is_stale_refusal(outcomes[-1]), outcomes[-1]
                # From then on every epoch-0 append is refused, and epoch 1 is taken.
                again = peer.append_by(0, b"epoch 0 again")
                assert is_stale_refusal(await peer.outcome(again.seq_num))
                routed = peer.append_by(1, b"epoch 1")
                assert isinstance(await peer.outcome(routed.seq_num), FeedEntry)
            finally:
                await peer.close()

        run(after_the_split())
