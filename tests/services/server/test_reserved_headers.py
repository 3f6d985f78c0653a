"""No client can forge a split record: a server refuses a client's append with the split records'
header, and the client refuses to build one (docs/design/splits.md "Why no update is lost").

Real storage and server processes over real sockets: the raw protocol shows the server's refusal (a
client that skips its own check), the ``WaltzClient`` its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.storage import run

from tests.client.client_helpers import Append, MemoryStore
from tests.services.server.clusters import raw_stream_cluster
from tests.services.server.test_client_protocol import RawClient, generation_of
from waltz import WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.protocol import client_pb2
from waltz.protocol.records import crc32
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier

RESERVED = (
    "the header 0x57505348 is reserved for partition split records, which only a partition's owner writes"
)
#: A well-formed barrier: what a forger would send.
BARRIER = SplitBarrier(epoch=1, count=2, previous_count=1, parent=0).encode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with raw_stream_cluster(tmp_path_factory, zookeeper, "reserved-headers-cluster") as local:
        yield local


async def high_water_mark(peer: RawClient) -> int:
    """The partition's high-water mark, asked on ``peer``'s stream."""
    request = client_pb2.HighWaterMarkRequest(req_id=peer.req_id())
    peer.outgoing.put_nowait(client_pb2.ClientMessage(high_water_mark=request))
    return (await peer.next("high_water_mark")).high_water_mark.transaction_id


def test_an_append_with_the_split_header_is_refused_and_the_next_one_commits(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 100, generation)
        try:
            before = await peer.mount_at_high_water_mark()
            forged = peer.append(-1, BARRIER, header=SPLIT_RECORD_HEADER)
            refused = await peer.next("error")
            assert refused.error.req_id == forged
            assert RESERVED in refused.error.message
            assert await high_water_mark(peer) == before  # nothing written
            normal = peer.append(-1, b"an ordinary append", write=[1])
            entry = await peer.next_feed()
            assert entry.req_id.seq_num == normal.seq_num
            assert entry.transaction_id == before + 1  # the refused append took no transaction ID
            assert entry.header == 7
        finally:
            await peer.close()

    run(scenario())


def test_a_row_with_the_split_header_is_refused_and_the_rows_around_it_commit(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 200, generation)
        try:
            before = await peer.mount_at_high_water_mark()
            data = [b"before", BARRIER, b"after"]
            peer.outgoing.put_nowait(
                client_pb2.ClientMessage(
                    appends=client_pb2.AppendRequests(
                        client_id=peer.client_id,
                        generation=generation,
                        partition_id=0,
                        seq_nums=[50, 51, 52],
                        client_high_water_marks=[-1] * 3,
                        headers=[7, SPLIT_RECORD_HEADER, 7],
                        data=data,
                        checksums=[crc32(d) for d in data],
                    )
                )
            )
            first, errors = await peer.next_feed_keeping("error")
            second, more_errors = await peer.next_feed_keeping("error")
            (refused,) = errors + more_errors
            assert refused.error.req_id.seq_num == 51
            assert RESERVED in refused.error.message
            assert [
                (first.req_id.seq_num, first.transaction_id),
                (second.req_id.seq_num, second.transaction_id),
            ] == [
                (50, before + 1),
                (52, before + 2),
            ]
            assert await high_water_mark(peer) == before + 2
        finally:
            await peer.close()

    run(scenario())


def test_the_client_fails_a_context_with_the_split_header_before_sending_it(cluster: LocalCluster) -> None:
    (owner,) = cluster.wait_ready(30).values()
    store = MemoryStore({0: owner.high_water_mark})
    config = WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)
    with WaltzClient(store, config) as client:
        forged = Append(0, BARRIER, header=SPLIT_RECORD_HEADER)
        with pytest.raises(ValueError, match=RESERVED):
            client.submit(forged).result(30)
        assert forged.outcomes.executions == 1  # not retried
        (told,) = forged.outcomes.exceptions  # on_exception, once
        assert isinstance(told, ValueError) and RESERVED in str(told)
        committed = client.submit(Append(0, b"an ordinary append")).result(30)
    assert committed.transaction_id == owner.high_water_mark + 1  # the refused context wrote nothing
