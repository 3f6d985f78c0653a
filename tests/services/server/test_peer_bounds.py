"""What one client-role peer can cost a server is bounded (docs/design/server.md, "Bounds on what a
peer costs"): per-client state, lock hashes per append and per message, a connection's queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from support.storage import run

from tests.services.server.clusters import raw_stream_cluster
from tests.services.server.test_client_protocol import RawClient, generation_of
from waltz.local.cluster import LocalCluster
from waltz.protocol import client_pb2, client_pb2_grpc, common_pb2
from waltz.protocol.records import crc32
from waltz.protocol.server_client import ServerAdminClient
from waltz.services.server.client_service import MAX_CLIENT_IDS_PER_CONNECTION

PER_APPEND = 50
PER_MESSAGE = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    limits = {
        "WALTZ_SERVER_MAX_LOCK_HASHES_PER_APPEND": str(PER_APPEND),
        "WALTZ_SERVER_MAX_LOCK_HASHES_PER_MESSAGE": str(PER_MESSAGE),
    }
    with raw_stream_cluster(tmp_path_factory, zookeeper, "peer-bounds-cluster", server_env=limits) as local:
        yield local


async def client_states(cluster: LocalCluster) -> int:
    """The partition's count of per-client entries, from the server's admin status."""
    async with ServerAdminClient(cluster.servers[0].endpoint, timeout=10) as admin:
        status = await admin.status()
    (partition,) = status.partitions
    return partition.client_states


def flush(client: RawClient, client_id: int) -> client_pb2.ClientMessage:
    client.seq += 1
    req_id = common_pb2.ReqId(
        client_id=client_id, generation=client.generation, partition_id=0, seq_num=client.seq
    )
    return client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=req_id))


def test_flushes_under_client_ids_not_mounted_are_refused_and_keep_no_state(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    endpoint = cluster.servers[0].endpoint

    async def scenario() -> None:
        before = await client_states(cluster)
        peer = RawClient(endpoint, 1000, generation)
        try:
            await peer.mount_at_high_water_mark()
            # Flushes under 20,000 client IDs this connection never mounted, in a few stream messages.
            for first in range(0, 20_000, 5_000):
                peer.outgoing.put_nowait(flush(peer, 2000 + first))
                for client_id in range(2001 + first, 2000 + first + 5_000):
                    peer.outgoing.put_nowait(flush(peer, client_id))
            refused = await peer.next("error", timeout=30)
            assert "has not mounted partition 0 on this connection" in refused.error.message
            assert refused.error.req_id.client_id == 2000
            # The connection's own client ID still works: its flush is answered.
            peer.outgoing.put_nowait(flush(peer, 1000))
            answer = await peer.next("flush", timeout=30)
            assert answer.flush.req_id.client_id == 1000
            assert await client_states(cluster) <= before + 1  # the mounted client alone
        finally:
            await peer.close()
        # Its state goes with the connection.
        for _ in range(100):
            if await client_states(cluster) <= before:
                break
            await asyncio.sleep(0.1)
        assert await client_states(cluster) == before

    run(scenario())


def test_client_state_goes_when_the_stream_closes(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    endpoint = cluster.servers[0].endpoint

    async def scenario() -> None:
        before = await client_states(cluster)
        peers = [RawClient(endpoint, 3000 + i, generation) for i in range(20)]
        try:
            for peer in peers:
                await peer.mount_at_high_water_mark()
                peer.append(-1, b"an append", write=[peer.client_id])
            for peer in peers:
                await peer.next_feed(timeout=30)
            assert await client_states(cluster) == before + len(peers)
        finally:
            for peer in peers:
                await peer.close()
        for _ in range(100):
            if await client_states(cluster) <= before:
                break
            await asyncio.sleep(0.1)
        assert await client_states(cluster) == before, "the closed connections' client state stayed"

    run(scenario())


def test_an_append_with_too_many_lock_hashes_is_refused_and_the_next_one_commits(
    cluster: LocalCluster,
) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 4000, generation)
        try:
            await peer.mount_at_high_water_mark()
            too_many = peer.append(-1, b"many locks", write=list(range(PER_APPEND)), read=[99_999])
            refused = await peer.next("error")
            assert refused.error.req_id == too_many
            assert f"{PER_APPEND + 1} lock hashes, more than the {PER_APPEND}" in refused.error.message
            assert "server.maxLockHashesPerAppend" in refused.error.message
            within = peer.append(-1, b"enough locks", write=list(range(1_000_000, 1_000_000 + PER_APPEND)))
            entry = await peer.next_feed()
            assert entry.req_id.seq_num == within.seq_num
        finally:
            await peer.close()

    run(scenario())


def test_a_message_with_too_many_lock_hashes_is_refused_whole(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 5000, generation)
        try:
            await peer.mount_at_high_water_mark()
            rows = PER_MESSAGE // PER_APPEND + 1  # each row within the per-append limit
            data = [f"row {i}".encode() for i in range(rows)]
            peer.outgoing.put_nowait(
                client_pb2.ClientMessage(
                    appends=client_pb2.AppendRequests(
                        client_id=peer.client_id,
                        generation=generation,
                        partition_id=0,
                        seq_nums=[100 + i for i in range(rows)],
                        client_high_water_marks=[-1] * rows,
                        headers=[0] * rows,
                        data=data,
                        checksums=[crc32(d) for d in data],
                        write_lock_counts=[PER_APPEND] * rows,
                        write_lock_hashes=list(range(rows * PER_APPEND)),
                    )
                )
            )
            refused = await peer.next("error")
            assert f"{rows * PER_APPEND} lock hashes, more than the {PER_MESSAGE}" in refused.error.message
            assert "server.maxLockHashesPerMessage" in refused.error.message
            await peer.nothing_more()  # none of its rows was appended
        finally:
            await peer.close()

    run(scenario())


def test_a_connection_mounts_under_a_bounded_number_of_client_ids(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)

    async def scenario() -> None:
        peer = RawClient(cluster.servers[0].endpoint, 6000, generation)
        try:
            for client_id in range(6000, 6000 + MAX_CLIENT_IDS_PER_CONNECTION):
                peer.client_id = client_id
                peer.mount(-1)
                assert (await peer.next("mount")).mount.partition_ready
            peer.client_id = 7000
            refused = peer.mount(-1)
            error = await peer.next("error")
            assert error.error.req_id == refused
            assert f"already carries {MAX_CLIENT_IDS_PER_CONNECTION} client IDs" in error.error.message
        finally:
            await peer.close()

    run(scenario())


def resident_mib(pid: int) -> float:
    """A process's resident memory in MiB (``VmRSS`` of /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_a_peer_that_never_reads_its_answers_costs_a_bounded_queue(cluster: LocalCluster) -> None:
    generation = generation_of(cluster)
    (server_pid,) = [pid for name, pid in cluster.pids().items() if name.startswith("server")]
    client_id = 8000
    sent = 0

    def req_id(seq: int) -> common_pb2.ReqId:
        return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=0, seq_num=seq)

    async def requests() -> AsyncIterator[client_pb2.ClientMessages]:
        nonlocal sent
        mount = client_pb2.MountRequest(req_id=req_id(1), client_high_water_mark=-1, seq_num=1)
        yield client_pb2.ClientMessages(messages=[client_pb2.ClientMessage(mount=mount)])
        # 400,000 flushes, each answered: without a bound the server queues every answer.
        for first in range(2, 400_002, 20_000):
            yield client_pb2.ClientMessages(
                messages=[
                    client_pb2.ClientMessage(flush=client_pb2.FlushRequest(req_id=req_id(seq)))
                    for seq in range(first, first + 20_000)
                ]
            )
            sent += 20_000

    async def scenario() -> None:
        before = resident_mib(server_pid)
        async with grpc.aio.insecure_channel(cluster.servers[0].endpoint) as channel:
            call = client_pb2_grpc.WaltzServerServiceStub(channel).Stream(requests())
            answers = await call.read()  # the mount's answer, then nothing more is read
            assert isinstance(answers, client_pb2.ServerMessages)
            for _ in range(300):  # until the server stops taking requests, or took them all
                await asyncio.sleep(0.1)
                if sent >= 400_000:
                    break
            await asyncio.sleep(3)
            grown = resident_mib(server_pid) - before
            print(f"{sent} flushes sent; the server's resident memory grew {grown:.0f} MiB")
            call.cancel()
        assert grown < 40, f"the server grew by {grown:.0f} MiB for one peer that reads nothing"

    run(scenario())
