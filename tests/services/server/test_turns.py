"""One connection's work cannot hold the server's event loop, nor its queue, without bound
(docs/design/server.md, "Bounds on what a peer costs"): rows per ``AppendRequests``, the work
done per turn counted in rows and lock hashes, a connection's backlog checked between rows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from support.storage import run

from tests.services.server.clusters import raw_stream_cluster
from tests.services.server.test_client_protocol import RawClient, generation_of
from tests.services.server.test_peer_bounds import resident_mib
from waltz.local.cluster import LocalCluster
from waltz.protocol import client_pb2, common_pb2
from waltz.protocol.records import crc32
from waltz.services.server.appends import MAX_ROWS_PER_MESSAGE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with raw_stream_cluster(tmp_path_factory, zookeeper, "turns-cluster") as local:
        yield local


def appends(
    client_id: int, generation: int, first_seq: int, rows: int, checksum: int | None = None
) -> client_pb2.ClientMessage:
    """An ``AppendRequests`` of ``rows`` empty appends (with ``checksum``, else the right one)."""
    return client_pb2.ClientMessage(
        appends=client_pb2.AppendRequests(
            client_id=client_id,
            generation=generation,
            partition_id=0,
            seq_nums=range(first_seq, first_seq + rows),
            client_high_water_marks=[-1] * rows,
            headers=[0] * rows,
            data=[b""] * rows,
            checksums=[crc32(b"") if checksum is None else checksum] * rows,
        )
    )


def flush(peer: RawClient) -> common_pb2.ReqId:
    req_id = peer.req_id()
    peer.outgoing.put_nowait(client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=req_id)))
    return req_id


async def longest_wait_of_a_prober(
    endpoint: str, generation: int, peer: RawClient, messages: list[client_pb2.ClientMessage]
) -> tuple[float, float, int]:
    """Send ``messages`` and a flush in one stream message from ``peer`` while another connection
    asks the high-water mark again and again.

    Returns:
        The prober's longest wait for an answer, seconds from sending the messages to the
        flush's answer (the server handled them all), and the prober's answers meanwhile.
    """
    loop = asyncio.get_running_loop()
    prober = RawClient(endpoint, 1, generation)
    waits: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            request = client_pb2.HighWaterMarkRequest(req_id=prober.req_id())
            sent = loop.time()
            prober.outgoing.put_nowait(client_pb2.ClientMessage(high_water_mark=request))
            await prober.next("high_water_mark", timeout=120)
            waits.append(loop.time() - sent)
            await asyncio.sleep(0.02)

    try:
        probing = asyncio.ensure_future(probe())
        await asyncio.sleep(0.5)
        answered_before = len(waits)
        assert answered_before, "the prober got no answer before the load"
        start = loop.time()
        for message in messages:
            peer.outgoing.put_nowait(message)
        marker = flush(peer)
        answer = await peer.next("flush", timeout=300)
        assert answer.flush.req_id == marker
        duration = loop.time() - start
        done.set()
        await asyncio.wait_for(probing, 120)
        return max(waits), duration, len(waits) - answered_before
    finally:
        await prober.close()


def test_an_appends_message_over_the_row_bound_is_refused_whole(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 100, generation)
        try:
            await peer.mount_at_high_water_mark()
            peer.outgoing.put_nowait(appends(peer.client_id, generation, 1000, MAX_ROWS_PER_MESSAGE + 1))
            refused = await peer.next("error", timeout=30)
            assert not refused.error.HasField("req_id")
            assert (
                f"{MAX_ROWS_PER_MESSAGE + 1} rows, more than the {MAX_ROWS_PER_MESSAGE}"
                in refused.error.message
            )
            await peer.nothing_more()  # none of its rows was appended
            # A message at the bound is taken: its rows commit.
            peer.outgoing.put_nowait(appends(peer.client_id, generation, 20_000, MAX_ROWS_PER_MESSAGE))
            assert (await peer.next_feed(timeout=60)).req_id.seq_num == 20_000
        finally:
            await peer.close()

    run(scenario())


def test_rows_dropped_in_bulk_do_not_hold_another_connection(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    endpoint = cluster.servers[0].endpoint

    async def scenario() -> None:
        peer = RawClient(endpoint, 200, generation)
        try:
            await peer.mount_at_high_water_mark()
            # 1,000,000 rows of another generation, each dropped, in one stream message.
            stale = [
                appends(peer.client_id, generation + 1, 1 + i * MAX_ROWS_PER_MESSAGE, MAX_ROWS_PER_MESSAGE)
                for i in range(100)
            ]
            longest, duration, answers = await longest_wait_of_a_prober(endpoint, generation, peer, stale)
            print(f"rows handled in {duration:.2f} s; the prober waited {longest:.2f} s ({answers} answers)")
            assert longest < duration / 2, (
                f"the prober waited {longest:.2f} s for an answer while the server took {duration:.2f} s "
                "over one connection's rows"
            )
        finally:
            await peer.close()

    run(scenario())


def test_lock_hashes_in_bulk_do_not_hold_another_connection(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    endpoint = cluster.servers[0].endpoint

    async def scenario() -> None:
        peer = RawClient(endpoint, 300, generation)
        try:
            mark = await peer.mount_at_high_water_mark()
            # 256 appends of 4,096 READ lock hashes each (the most an append may carry), in one
            # stream message: each is within every bound, and each commits.
            locked = []
            for i in range(256):
                request = client_pb2.AppendRequest(
                    req_id=peer.req_id(),
                    client_high_water_mark=mark,
                    read_lock_hashes=range(i * 4096, (i + 1) * 4096),
                    data=b"d",
                    checksum=crc32(b"d"),
                )
                locked.append(client_pb2.ClientMessage(append=request))
            longest, duration, answers = await longest_wait_of_a_prober(endpoint, generation, peer, locked)
            print(
                f"appends handled in {duration:.2f} s; the prober waited {longest:.2f} s ({answers} answers)"
            )
            assert longest < duration / 2, (
                f"the prober waited {longest:.2f} s for an answer while the server took {duration:.2f} s "
                "over one connection's lock hashes"
            )
        finally:
            await peer.close()

    run(scenario())


def test_one_huge_message_of_refused_rows_costs_bounded_memory(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    (server_pid,) = [pid for name, pid in cluster.pids().items() if name.startswith("server")]
    endpoint = cluster.servers[0].endpoint

    async def scenario() -> None:
        peer = RawClient(endpoint, 400, generation)
        try:
            await peer.mount_at_high_water_mark()
            before = resident_mib(server_pid)
            # One AppendRequests of 1,000,000 rows whose data does not match their checksum: built
            # and refused row by row, it costs the server every row and every ServerError at once.
            peer.outgoing.put_nowait(appends(peer.client_id, generation, 1000, 1_000_000, checksum=1))
            marker = flush(peer)
            errors = 0
            while True:
                answer = await asyncio.wait_for(peer.incoming.get(), 120)
                if isinstance(answer, client_pb2.ServerMessage) and answer.WhichOneof("body") == "error":
                    errors += 1
                elif isinstance(answer, client_pb2.ServerMessage) and answer.WhichOneof("body") == "flush":
                    assert answer.flush.req_id == marker
                    break
            grown = resident_mib(server_pid) - before
            print(f"{errors} errors; the server's resident memory grew {grown:.0f} MiB")
            assert errors == 1, f"{errors} errors for one message refused whole"
            # Receiving the message costs tens of MiB (gRPC and protobuf); building its rows and
            # errors, hundreds more.
            assert grown < 150, f"the server grew by {grown:.0f} MiB for one message"
        finally:
            await peer.close()

    run(scenario())
