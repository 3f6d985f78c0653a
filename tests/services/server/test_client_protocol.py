"""The client-server protocol on the wire (docs/protocol.md), with raw gRPC messages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
import support
from support.feed import FeedEntry, feed_entries
from support.storage import run

from tests.services.server.clusters import raw_stream_cluster
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.protocol import client_pb2, client_pb2_grpc, common_pb2
from waltz.protocol.records import crc32

DATA_CACHE_SIZE = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    # A small data cache: data ranges come partly from the cache, partly from storage.
    cache = {"WALTZ_SERVER_TRANSACTION_DATA_CACHE_SIZE": str(DATA_CACHE_SIZE)}
    with raw_stream_cluster(
        tmp_path_factory, zookeeper, "protocol-cluster", storages=3, server_env=cache
    ) as local:
        yield local


class RawClient:
    """A client stream speaking raw protocol messages."""

    def __init__(self, endpoint: str, client_id: int, generation: int) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.stub = client_pb2_grpc.WaltzServerServiceStub(self.channel)
        self.client_id = client_id
        self.generation = generation
        self.seq = 0
        self.outgoing: asyncio.Queue[client_pb2.ClientMessage] = asyncio.Queue()
        # Server messages in order, each FeedEntries run as its entries (docs/protocol.md).
        self.incoming: asyncio.Queue[client_pb2.ServerMessage | FeedEntry] = asyncio.Queue()
        self.call = self.stub.Stream(self._requests())
        self.reader = asyncio.ensure_future(self._read())

    async def _requests(self) -> AsyncIterator[client_pb2.ClientMessages]:
        while True:
            message = await self.outgoing.get()
            batch = [message]
            while not self.outgoing.empty():
                batch.append(self.outgoing.get_nowait())
            yield client_pb2.ClientMessages(messages=batch)

    async def _read(self) -> None:
        async for batch in self.call:
            for message in batch.messages:
                if message.WhichOneof("body") == "feed_entries":
                    for entry in feed_entries(message.feed_entries):
                        await self.incoming.put(entry)
                else:
                    await self.incoming.put(message)

    def req_id(self, generation: int | None = None) -> common_pb2.ReqId:
        self.seq += 1
        gen = self.generation if generation is None else generation
        return common_pb2.ReqId(client_id=self.client_id, generation=gen, partition_id=0, seq_num=self.seq)

    def mount(
        self,
        high_water_mark: int,
        network_seq: int = 1,
        generation: int | None = None,
        feed_window: int = 0,
    ) -> common_pb2.ReqId:
        req_id = self.req_id(generation)
        self.outgoing.put_nowait(
            client_pb2.ClientMessage(
                mount=client_pb2.MountRequest(
                    req_id=req_id,
                    client_high_water_mark=high_water_mark,
                    seq_num=network_seq,
                    feed_window=feed_window,
                )
            )
        )
        return req_id

    def append(
        self,
        high_water_mark: int,
        data: bytes,
        write: Sequence[int] = (),
        read: Sequence[int] = (),
        header: int = 7,
    ) -> common_pb2.ReqId:
        req_id = self.req_id()
        self.outgoing.put_nowait(
            client_pb2.ClientMessage(
                append=client_pb2.AppendRequest(
                    req_id=req_id,
                    client_high_water_mark=high_water_mark,
                    write_lock_hashes=list(write),
                    read_lock_hashes=list(read),
                    header=header,
                    data=data,
                    checksum=crc32(data),
                )
            )
        )
        return req_id

    async def mount_at_high_water_mark(self) -> int:
        """Mount from the start (the feed replays what is there) and return the partition's
        high-water mark, asked after the mount was answered."""
        self.mount(-1)
        assert (await self.next("mount")).mount.partition_ready
        request = client_pb2.HighWaterMarkRequest(req_id=self.req_id())
        self.outgoing.put_nowait(client_pb2.ClientMessage(high_water_mark=request))
        return (await self.next("high_water_mark")).high_water_mark.transaction_id

    def feed_window(self, window_end: int, generation: int | None = None) -> common_pb2.ReqId:
        req_id = self.req_id(generation)
        self.outgoing.put_nowait(
            client_pb2.ClientMessage(feed_window=client_pb2.FeedWindow(req_id=req_id, window_end=window_end))
        )
        return req_id

    async def next(self, kind: str, timeout: float = 10) -> client_pb2.ServerMessage:
        """The next message of ``kind`` (not a feed entry), skipping others."""
        while True:
            item = await asyncio.wait_for(self.incoming.get(), timeout)
            if kind_of(item) == kind:
                assert not isinstance(item, FeedEntry)
                return item

    async def next_feed(self, timeout: float = 10) -> FeedEntry:
        """The next feed entry, skipping other messages."""
        while True:
            item = await asyncio.wait_for(self.incoming.get(), timeout)
            if isinstance(item, FeedEntry):
                return item

    async def next_feed_keeping(
        self, kind: str, timeout: float = 10
    ) -> tuple[FeedEntry, list[client_pb2.ServerMessage]]:
        """The next feed entry, and the messages of ``kind`` that came before it (others skipped)."""
        kept = []
        while True:
            item = await asyncio.wait_for(self.incoming.get(), timeout)
            if isinstance(item, FeedEntry):
                return item, kept
            if kind_of(item) == kind:
                kept.append(item)

    async def feed_ids(self, count: int) -> list[int]:
        """The transaction IDs of the next ``count`` feed entries (failing on a mount response)."""
        ids = []
        while len(ids) < count:
            item = await asyncio.wait_for(self.incoming.get(), 10)
            assert kind_of(item) != "mount", f"mount response after {ids}: the feed had not reached the mark"
            if isinstance(item, FeedEntry):
                ids.append(item.transaction_id)
        return ids

    async def nothing_more(self, seconds: float = 0.5) -> None:
        """Fail when a feed entry or a mount response arrives within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            item = await asyncio.wait_for(self.incoming.get(), seconds)
            assert kind_of(item) not in ("feed", "mount"), item

    async def close(self) -> None:
        self.call.cancel()
        self.reader.cancel()
        await self.channel.close(None)


def kind_of(item: client_pb2.ServerMessage | FeedEntry) -> str | None:
    """``feed`` for a feed entry, else the server message's kind."""
    return "feed" if isinstance(item, FeedEntry) else item.WhichOneof("body")


def generation_of(cluster: LocalCluster) -> int:
    return cluster.wait_ready(30)[0].generation


def test_mount_append_feed_lock_failures_flush_and_data(cluster: LocalCluster) -> None:
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        a, b = RawClient(endpoint, 901, generation), RawClient(endpoint, 902, generation)
        try:
            # A wrong generation is not ready.
            a.mount(-1, generation=generation + 100)
            assert not (await a.next("mount")).mount.partition_ready
            a.mount(-1)
            b.mount(-1)
            assert (await a.next("mount")).mount.partition_ready
            assert (await b.next("mount")).mount.partition_ready
            hwm_request = client_pb2.HighWaterMarkRequest(req_id=a.req_id())
            a.outgoing.put_nowait(client_pb2.ClientMessage(high_water_mark=hwm_request))
            start = (await a.next("high_water_mark")).high_water_mark.transaction_id
            # An append without locks: both clients see it in their feed, with its ReqId.
            first = a.append(start, b"first")
            feed_a = await a.next_feed()
            feed_b = await b.next_feed()
            assert feed_a.req_id == first and feed_b.req_id == first
            txn = feed_a.transaction_id
            assert txn == start + 1 and feed_a.header == 7
            # Two appends with the same WRITE lock and the same high-water mark, both sent before
            # either is acknowledged: exactly one commits; the other gets a lock failure naming it
            # (before the feed entry of the winner when it waited for it in the store pipeline,
            # after it when the winner had committed already).
            lock = 0x1234
            one = a.append(txn, b"from a", write=[lock])
            two = b.append(txn, b"from b", write=[lock])
            committed, failures_of_a = await a.next_feed_keeping("lock_failure")
            assert committed.req_id in (one, two)
            loser = b if committed.req_id == one else a
            if loser is a and failures_of_a:
                failure = failures_of_a[0].lock_failure
            else:
                assert not failures_of_a, "the winner got a lock failure"
                failure = (await loser.next("lock_failure")).lock_failure
            assert failure.req_id in (one, two) and failure.req_id != committed.req_id
            assert failure.transaction_id == committed.transaction_id
            # A stale read of the lock fails; an up-to-date one passes.
            stale = a.append(txn, b"stale", read=[lock])
            assert (await a.next("lock_failure")).lock_failure.req_id == stale
            fresh = a.append(committed.transaction_id, b"fresh", write=[lock])
            assert (await a.next_feed()).req_id == fresh
            # Flush answers with the high-water mark once everything before it resolved.
            a.outgoing.put_nowait(client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=a.req_id())))
            flushed = (await a.next("flush")).flush.transaction_id
            assert flushed == committed.transaction_id + 1
            # Transaction data over the RPC.
            response = await a.stub.GetTransactionData(
                client_pb2.TransactionDataRequest(req_id=a.req_id(), transaction_id=txn), timeout=10
            )
            assert response.success and response.data == b"first" and response.checksum == crc32(b"first")
            missing = await a.stub.GetTransactionData(
                client_pb2.TransactionDataRequest(req_id=a.req_id(), transaction_id=10**9), timeout=10
            )
            assert not missing.success and "not committed" in missing.error_message
            # Two appends of one client on one lock in a row, then one without locks: the second
            # finds the first pending and is refused once the first commits, naming it, before
            # the feed entries of the first and the third (else the client's transaction monitor
            # would take the refused append for a lost one on seeing the third:
            # docs/design/client.md "Failed-append detection").
            pair_lock = 0x5678
            one_of_two = a.append(flushed, b"one of two", write=[pair_lock])
            two_of_two = a.append(flushed, b"two of two", write=[pair_lock])
            after_two = a.append(flushed, b"after two")
            seen: list[tuple[str, int]] = []
            while len(seen) < 3:
                item = await asyncio.wait_for(a.incoming.get(), 10)
                if isinstance(item, FeedEntry):
                    if item.req_id in (one_of_two, after_two):
                        seen.append(("feed", item.transaction_id))
                elif item.WhichOneof("body") == "lock_failure":
                    assert item.lock_failure.req_id == two_of_two
                    seen.append(("lock_failure", item.lock_failure.transaction_id))
            assert seen == [("lock_failure", flushed + 1), ("feed", flushed + 1), ("feed", flushed + 2)]
            # A corrupted append is refused with an error, not committed.
            bad = a.req_id()
            a.outgoing.put_nowait(
                client_pb2.ClientMessage(
                    append=client_pb2.AppendRequest(
                        req_id=bad, client_high_water_mark=flushed, data=b"x", checksum=1
                    )
                )
            )
            assert "checksum" in (await a.next("error")).error.message
        finally:
            await a.close()
            await b.close()

    run(scenario())


def test_appends_in_columns_are_handled_row_by_row_in_order(cluster: LocalCluster) -> None:
    """docs/protocol.md "Appends": each row of an AppendRequests is what an AppendRequest with its
    values would be, in order; a malformed one is refused whole with an error."""
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        a = RawClient(endpoint, 903, generation)
        try:
            start = await a.mount_at_high_water_mark()
            lock, other, third = 0x4321, 0x8765, 0x9876
            seqs = [a.req_id().seq_num for _ in range(4)]
            data = [b"row 0", b"row 1", b"row 2", b"row 3"]
            checksums = [crc32(d) for d in data]
            checksums[2] ^= 1  # row 2 is damaged
            rows = client_pb2.AppendRequests(
                client_id=903,
                generation=generation,
                partition_id=0,
                seq_nums=seqs,
                client_high_water_marks=[start] * 4,
                headers=[1, 2, 3, 4],
                data=data,
                checksums=checksums,
                # row 0 writes lock; row 1 writes it too (in flight: refused); row 3 writes two.
                write_lock_counts=[1, 1, 0, 2],
                write_lock_hashes=[lock, lock, other, third],
            )
            a.outgoing.put_nowait(client_pb2.ClientMessage(appends=rows))

            def req(seq: int) -> common_pb2.ReqId:
                return common_pb2.ReqId(client_id=903, generation=generation, partition_id=0, seq_num=seq)

            feed: list[FeedEntry] = []
            others: list[client_pb2.ServerMessage] = []
            while len(feed) < 2 or len(others) < 2:
                item = await asyncio.wait_for(a.incoming.get(), 10)
                if isinstance(item, FeedEntry):
                    feed.append(item)
                elif kind_of(item) in ("lock_failure", "error"):
                    others.append(item)
            assert [(e.req_id, e.header, e.transaction_id) for e in feed] == [
                (req(seqs[0]), 1, start + 1),
                (req(seqs[3]), 4, start + 2),
            ]
            failure = next(m.lock_failure for m in others if kind_of(m) == "lock_failure")
            assert (failure.req_id, failure.transaction_id) == (req(seqs[1]), start + 1)
            error = next(m.error for m in others if kind_of(m) == "error")
            assert error.req_id == req(seqs[2]) and "checksum" in error.message
            # Counts that do not add up: nothing of the message is appended.
            broken = client_pb2.AppendRequests(
                client_id=903,
                generation=generation,
                partition_id=0,
                seq_nums=[a.req_id().seq_num],
                client_high_water_marks=[start + 2],
                headers=[0],
                data=[b"broken"],
                checksums=[crc32(b"broken")],
                write_lock_counts=[2],
                write_lock_hashes=[lock],
            )
            a.outgoing.put_nowait(client_pb2.ClientMessage(appends=broken))
            message = (await a.next("error")).error.message
            assert "malformed AppendRequests" in message and "add up to 2" in message, message
            after = a.append(start + 2, b"after", write=[lock])
            entry = await a.next_feed()
            assert (entry.req_id, entry.transaction_id) == (after, start + 3)
        finally:
            await a.close()

    run(scenario())


def test_data_ranges_come_in_pages_from_cache_and_storage(cluster: LocalCluster) -> None:
    """GetTransactionDataRange answers a prefix of the range: at most 4 MiB, at most the mark."""
    endpoint, generation = cluster.owner(0), generation_of(cluster)
    big = 100 * 1024
    datas = [bytes([i]) * big if i % 2 == 0 else f"small {i}".encode() for i in range(90)]

    async def scenario() -> None:
        a = RawClient(endpoint, 905, generation)
        try:
            start = await a.mount_at_high_water_mark()
            for i, data in enumerate(datas):
                a.append(start + i, data)
            first = start + 1
            assert await a.feed_ids(len(datas)) == list(range(first, first + len(datas)))

            async def data_range(first_id: int, count: int) -> client_pb2.TransactionDataRangeResponse:
                request = client_pb2.TransactionDataRangeRequest(
                    req_id=a.req_id(), first_transaction_id=first_id, count=count
                )
                response: client_pb2.TransactionDataRangeResponse = await a.stub.GetTransactionDataRange(
                    request, timeout=10
                )
                return response

            # 45 transactions of 100 KiB do not fit in 4 MiB: the answer stops before, from storage
            # (the cache holds only the last 8).
            got: list[bytes] = []
            pages = 0
            while len(got) < len(datas):
                pages += 1
                page = await data_range(first + len(got), len(datas) + 50)
                assert page.success, page.error_message
                assert page.first_transaction_id == first + len(got)
                assert len(page.data) == len(page.checksums) > 0
                assert len(page.data) == 1 or sum(map(len, page.data)) <= 4 << 20
                assert [crc32(d) for d in page.data] == list(page.checksums)
                got.extend(page.data)
                assert len(got) <= len(datas), "the answer went past the high-water mark"
            assert got == datas
            assert pages >= 2, f"4.4 MiB of data came in {pages} page(s) of at most 4 MiB"
            # The last few come from the cache, and a count stops where asked.
            tail = await data_range(first + len(datas) - 3, 2)
            assert list(tail.data) == datas[-3:-1]
            # Refusals: nothing committed there, a count that is not positive, another partition.
            for first_id, count, why in (
                (first + len(datas), 1, "not committed"),
                (-5, 3, "not committed"),
                (first, 0, "count must be positive"),
            ):
                refused = await data_range(first_id, count)
                assert not refused.success and why in refused.error_message, refused
                assert list(refused.data) == []
            elsewhere = common_pb2.ReqId(client_id=905, generation=generation, partition_id=5, seq_num=10**6)
            refused = await a.stub.GetTransactionDataRange(
                client_pb2.TransactionDataRangeRequest(req_id=elsewhere, first_transaction_id=first, count=1),
                timeout=10,
            )
            assert not refused.success and "not on this server" in refused.error_message
        finally:
            await a.close()

    run(scenario())


def test_a_late_mount_replays_the_feed_and_drops_the_older_connection(cluster: LocalCluster) -> None:
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        writer = RawClient(endpoint, 903, generation)
        try:
            writer.mount(-1)
            await writer.next("mount")
            sent = [writer.append(10**9, f"t{i}".encode()) for i in range(20)]
            ids = [await writer.next_feed() for _ in range(20)]
            # Other appends may be in the feed too: keep ours.
            ours = {f.req_id.seq_num: f.transaction_id for f in ids}
            assert all(r.seq_num in ours for r in sent)
            first_txn = min(ours.values())
            late = RawClient(endpoint, 904, generation)
            try:
                late.mount(first_txn - 1, network_seq=5)
                replay = []
                while True:
                    entry = await late.next_feed()
                    replay.append(entry.transaction_id)
                    if entry.transaction_id >= max(ours.values()):
                        break
                assert replay == list(range(first_txn, max(ours.values()) + 1))
                assert (await late.next("mount")).mount.partition_ready
            finally:
                await late.close()
        finally:
            await writer.close()

    run(scenario())


def test_a_mount_below_nothing_applied_is_refused_under_its_req_id(cluster: LocalCluster) -> None:
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        client = RawClient(endpoint, 250, generation)
        try:
            for mark in (-2, -1000):
                refused = client.mount(mark)
                error = await client.next("error")
                assert error.error.req_id == refused
                assert f"client_high_water_mark must be at least -1 (nothing applied yet), got {mark}" in (
                    error.error.message
                )
                await client.nothing_more()  # no mount response, no feed
            # The connection still mounts with a mark a client can hold.
            client.mount(-1)
            assert (await client.next("mount")).mount.partition_ready
        finally:
            await client.close()

    run(scenario())


def test_a_mount_above_the_high_water_mark_is_refused_as_ahead_of_the_log(cluster: LocalCluster) -> None:
    """docs/protocol.md "Mount": a mark above the partition's committed high-water mark is refused
    with CLIENT_AHEAD_OF_LOG and both marks, and nothing of it is kept (the connection's feed of
    the partition stops), where it was answered ready with a feed starting past the log."""
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        client = RawClient(endpoint, 251, generation)
        writer = RawClient(endpoint, 252, generation)
        try:
            mark = await client.mount_at_high_water_mark()
            for network_seq, ahead in ((2, mark + 1), (3, 10**9)):
                refused = client.mount(ahead, network_seq=network_seq)
                error = (await client.next("error")).error
                assert error.req_id == refused
                assert error.code == client_pb2.CLIENT_AHEAD_OF_LOG
                assert (error.client_high_water_mark, error.high_water_mark) == (ahead, mark)
                assert (
                    f"client high-water mark {ahead} is above partition 0's high-water mark {mark}: the "
                    "application's database is ahead of this log" in error.message
                ), error.message
                await client.nothing_more()  # no mount response
            # The refused mount replaced the connection's feed: a commit is not fed to it.
            writer.mount(mark)
            assert (await writer.next("mount")).mount.partition_ready
            sent = writer.append(10**9, b"after the refusal")
            committed = await writer.next_feed()
            assert committed.req_id.seq_num == sent.seq_num and committed.transaction_id == mark + 1
            await client.nothing_more()
            # The partition's own mark mounts as ever.
            client.mount(mark + 1, network_seq=4)
            assert (await client.next("mount")).mount.partition_ready
        finally:
            await client.close()
            await writer.close()

    run(scenario())


def test_the_feed_window_bounds_a_mount_and_grants_resume_it(cluster: LocalCluster) -> None:
    """docs/protocol.md "Feed window": parked at the window end, in catch-up and in realtime."""
    endpoint, generation = cluster.owner(0), generation_of(cluster)

    async def scenario() -> None:
        writer = RawClient(endpoint, 905, generation)
        reader = RawClient(endpoint, 906, generation)
        try:
            writer.mount(-1)  # no window: the replay of the whole log, then the response
            assert (await writer.next("mount")).mount.partition_ready
            sent = [writer.append(10**9, f"w{i}".encode()) for i in range(30)]
            ours = {}
            while len(ours) < len(sent):
                feed = await writer.next_feed()
                ours[feed.req_id.seq_num] = feed.transaction_id
            assert all(r.seq_num in ours for r in sent)
            first, last = min(ours.values()), max(ours.values())

            # Catch-up: fed up to mark + window, then parked; no mount response before the mark.
            reader.mount(first - 1, feed_window=10)
            assert await reader.feed_ids(10) == list(range(first, first + 10))
            await reader.nothing_more()
            reader.feed_window(first + 5)  # lower than the window: ignored
            reader.feed_window(first + 100, generation=generation + 1)  # another generation: dropped
            await reader.nothing_more()
            reader.feed_window(first + 19)
            assert await reader.feed_ids(10) == list(range(first + 10, first + 20))
            await reader.nothing_more()
            reader.feed_window(last + 3)
            assert await reader.feed_ids(last - first - 19) == list(range(first + 20, last + 1))
            assert (await reader.next("mount")).mount.partition_ready

            # Realtime: new commits stop at the window end until the next grant.
            more = [writer.append(10**9, f"m{i}".encode()) for i in range(6)]
            assert await reader.feed_ids(3) == [last + 1, last + 2, last + 3]
            await reader.nothing_more()
            reader.feed_window(last + 100)
            assert await reader.feed_ids(3) == [last + 4, last + 5, last + 6]
            assert len(more) == 6
        finally:
            await writer.close()
            await reader.close()

    run(scenario())


def test_a_stale_append_is_still_refused_after_the_owner_is_killed(tmp_path: Path, zookeeper: object) -> None:
    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=2,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path / "failover",
        delete_root=True,
    ) as local:
        owner_before = local.wait_ready(30)[0]
        lock = 0x5151

        async def before() -> int:
            client = RawClient(owner_before.endpoint, 905, owner_before.generation)
            try:
                client.mount(-1)
                await client.next("mount")
                client.append(10**9, b"writes the lock", write=[lock])
                return (await client.next_feed()).transaction_id
            finally:
                await client.close()

        committed = run(before())
        local.kill_server(local.owner_index(0))
        owner_after = local.wait_ready(30)[0]
        assert owner_after.endpoint != owner_before.endpoint
        assert owner_after.generation > owner_before.generation

        async def after() -> None:
            client = RawClient(owner_after.endpoint, 906, owner_after.generation)
            try:
                client.mount(-1)
                await client.next("mount")
                # Computed from a state before the lock's last write: refused by the new owner too.
                stale = client.append(committed - 1, b"stale", write=[lock])
                failure = (await client.next("lock_failure")).lock_failure
                assert failure.req_id == stale and failure.transaction_id >= committed
                fresh = client.append(committed, b"fresh", write=[lock])
                assert (await client.next_feed()).req_id == fresh
            finally:
                await client.close()

        run(after())


def test_appends_wait_while_the_store_holds_the_byte_budget(tmp_path: Path, zookeeper: object) -> None:
    """``server.maxPendingBytes`` of 1: every append waits until the one before it is committed,
    so 30 appends sent at once reach the storage nodes in 30 batches, all of them committed."""
    import urllib.request

    with LocalCluster(
        security=support.PLAINTEXT,
        storages=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path,
        delete_root=True,
        processes=ProcessOptions(metrics=True, server_env={"WALTZ_SERVER_MAX_PENDING_BYTES": "1"}),
    ) as local:
        endpoint, generation = local.owner(0), generation_of(local)

        async def scenario() -> None:
            a = RawClient(endpoint, 907, generation)
            try:
                a.mount(-1)
                assert (await a.next("mount")).mount.partition_ready
                for i in range(30):
                    a.append(i - 1, f"pressure {i}".encode())
                assert await a.feed_ids(30) == list(range(30))
            finally:
                await a.close()

        run(scenario())
        url = f"http://127.0.0.1:{local.servers[0].metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        batches = [
            line for line in text.splitlines() if line.startswith("waltz_server_partition_store_batches")
        ]
        assert batches and float(batches[0].split()[-1]) >= 30, batches


UNREADABLE = b"\xff\xff\xff\xff\x0f\x01\x02"  # not a protobuf message: a field tag that does not parse


def test_unreadable_unary_and_admin_requests_are_refused_as_invalid_arguments(cluster: LocalCluster) -> None:
    async def unary(endpoint: str, method: str) -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            call = channel.unary_unary(method)  # raw bytes in, raw bytes out
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(UNREADABLE, timeout=10)
        return refused.value

    async def stream(endpoint: str, method: str) -> grpc.aio.AioRpcError:
        async def requests() -> AsyncIterator[bytes]:
            yield UNREADABLE
            await asyncio.sleep(10)  # the answer comes before

        async with grpc.aio.insecure_channel(endpoint) as channel:
            call = channel.stream_stream(method)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call(requests(), timeout=10):
                    pass
        return refused.value

    async def scenario() -> None:
        server = cluster.owner(0)
        for method in ("GetTransactionData", "GetTransactionDataRange"):
            refused = await unary(server, f"/waltz.client.WaltzServerService/{method}")
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused)
            assert "unreadable request: DecodeError" in (refused.details() or ""), (method, refused)
        admin = cluster.storages[0].admin_address
        refused = await stream(admin, "/waltz.storage.StorageAdminService/Session")
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
        assert "unreadable admin request stream" in (refused.details() or "")

    run(scenario())
