"""Fuzzing the gRPC ports of a real storage node and a real server with malformed messages.

Raw bytes go over a channel with identity serializers, so what reaches the node is exactly what
the test chose: bytes that are not a protobuf message of the method's type, messages larger than
``maxMessageBytes``, and well-formed messages with random (often absurd) field values. After
each, the node must still be running and serve a well-behaved caller. The port answers:

* bytes that do not parse: the call ends with an error status (not ``OK``, not ``UNAVAILABLE``);
* an oversized message: ``RESOURCE_EXHAUSTED``;
* well-formed storage requests: exactly one response per request, in order, with its ``seq_num``;
* well-formed client messages: the stream stays open (a later mount on it is answered).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
import support
from google.protobuf.message import DecodeError, Message
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings
from support.storage import run

from waltz.local.cluster import LocalCluster
from waltz.local.nodes import LocalStorageNode
from waltz.protocol import client_pb2, common_pb2, server_pb2, storage_pb2
from waltz.protocol.records import crc32
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient

pytestmark = pytest.mark.fuzz

#: Seconds a node has to answer a malformed call.
ANSWER_TIMEOUT = 10.0
STORAGE_SESSION = "/waltz.storage.StorageService/Session"
STORAGE_ADMIN = "/waltz.storage.StorageAdminService/Session"
CLIENT_STREAM = "/waltz.client.WaltzServerService/Stream"
STREAMS = {STORAGE_SESSION: storage_pb2.StorageRequests, STORAGE_ADMIN: storage_pb2.AdminRequests}
UNARY = {
    "/waltz.client.WaltzServerService/GetTransactionData": client_pb2.TransactionDataRequest,
    "/waltz.server.ServerAdminService/Status": server_pb2.ServerStatusRequest,
    "/waltz.server.ServerAdminService/AppendRecords": server_pb2.AppendRecordsRequest,
    "/waltz.server.ServerAdminService/ReadRecords": server_pb2.ReadRecordsRequest,
}
NUM_PARTITIONS = 2
#: Bytes that no message type parses: field 1 as a varint that never ends.
UNPARSABLE = b"\x08" + b"\xff" * 10
#: The client ID of the probe mount that ends each malformed client stream (never drawn).
PROBE_CLIENT = 9999
#: One byte more than the nodes' default ``maxMessageBytes`` (32 MiB).
OVERSIZED = 32 * 1024 * 1024 + 1


@dataclass(frozen=True)
class Nodes:
    storage: LocalStorageNode  # a node of its own (fencing fuzz must not touch the cluster)
    cluster_key: str
    cluster: LocalCluster  # one storage node, one server, one partition


@pytest.fixture(scope="module")
def nodes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> Iterator[Nodes]:
    directory = tmp_path_factory.mktemp("fuzz-network")
    storage = LocalStorageNode(
        directory / "storage", name="fuzzed-storage", log_path=directory / "storage.log", insecure=True
    )
    key = str(uuid.uuid4())
    with (
        storage,
        LocalCluster(
            security=support.PLAINTEXT,
            storages=1,
            servers=1,
            partitions=1,
            zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
            work_dir=directory / "cluster",
            delete_root=True,
        ) as cluster,
    ):

        async def init() -> None:
            async with StorageAdminClient(storage.admin_address, key, NUM_PARTITIONS) as admin:
                for pid in range(NUM_PARTITIONS):
                    await admin.assign_partition(pid, True)

        run(init())
        yield Nodes(storage, key, cluster)


@pytest.fixture(autouse=True)
def _logs(request: pytest.FixtureRequest, nodes: Nodes) -> None:
    support.add_failure_logs(request.node, "fuzzed storage log", nodes.storage.process.log_tail)
    for server in nodes.cluster.servers:
        support.add_failure_logs(request.node, f"{server.process.name} log", server.process.log_tail)


# ---- raw calls --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    answers: list[bytes]


async def stream_call(
    address: str,
    method: str,
    messages: list[bytes],
    *,
    hold: bool = False,
    enough: Callable[[list[bytes]], bool] | None = None,
) -> Outcome:
    """Send raw messages on a bidirectional stream; collect raw answers until it ends.

    With ``hold`` the request side stays open after the messages (as a real peer's would) until
    the node ends the call, ``enough(answers)`` holds (the outcome is then ``OK``), or the time
    limit passes (``DEADLINE_EXCEEDED``).
    """
    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    done = asyncio.Event()

    async def requests():  # type: ignore[no-untyped-def]
        for message in messages:
            yield message
        if hold:
            await done.wait()

    call = channel.stream_stream(method)(requests(), timeout=ANSWER_TIMEOUT)
    answers: list[bytes] = []
    try:
        while True:
            answer = await call.read()
            if answer is grpc.aio.EOF:
                break
            answers.append(answer)
            if enough is not None and enough(answers):
                return Outcome(grpc.StatusCode.OK, "answered", answers)
        return Outcome(await call.code(), await call.details(), answers)
    except grpc.aio.AioRpcError as error:
        return Outcome(error.code(), error.details() or "", answers)
    finally:
        done.set()
        call.cancel()
        await channel.close(None)


async def unary_call(address: str, method: str, message: bytes) -> Outcome:
    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        answer = await channel.unary_unary(method)(message, timeout=ANSWER_TIMEOUT)
        return Outcome(grpc.StatusCode.OK, "", [answer])
    except grpc.aio.AioRpcError as error:
        return Outcome(error.code(), error.details() or "", [])
    finally:
        await channel.close(None)


def parses(message_type: type[Message], data: bytes) -> bool:
    try:
        message_type.FromString(data)
    except DecodeError:
        return False
    return True


# ---- liveness: the nodes still serve well-behaved callers ---------------------------------------------


def assert_storage_serves(nodes: Nodes) -> None:
    storage = nodes.storage
    assert storage.process.is_running(), f"the storage node died:\n{storage.process.log_tail()}"

    async def check() -> None:
        async with StorageAdminClient(storage.admin_address, nodes.cluster_key, NUM_PARTITIONS) as admin:
            await admin.partition_status()
        # Open only: the fuzzed requests may have fenced every session ID.
        await StorageSessionClient(storage.address, nodes.cluster_key, NUM_PARTITIONS, 1).open()

    run(asyncio.wait_for(check(), ANSWER_TIMEOUT))


def assert_server_serves(nodes: Nodes) -> None:
    server = nodes.cluster.servers[0]
    assert server.process.is_running(), f"the server died:\n{server.process.log_tail()}"

    async def check() -> None:
        async with ServerAdminClient(server.endpoint, timeout=ANSWER_TIMEOUT) as admin:
            status = await admin.status()
        assert [p.partition_id for p in status.partitions] == [0]

    run(check())


# ---- bytes that do not parse, and oversized messages ------------------------------------------------


def _unparsable_stream_params() -> list[object]:
    # The storage session and the client stream once swallowed such a message and ended the call
    # with status OK, so the peer learnt nothing of its error.
    return [
        pytest.param(method, id=method.rsplit(".", 1)[-1])
        for method in (STORAGE_SESSION, STORAGE_ADMIN, CLIENT_STREAM)
    ]


@pytest.mark.parametrize("method", _unparsable_stream_params())
def test_a_stream_message_that_does_not_parse_ends_the_call_with_an_error(nodes: Nodes, method: str) -> None:
    address = nodes.storage.admin_address if method == STORAGE_ADMIN else nodes.storage.address
    if method == CLIENT_STREAM:
        address = nodes.cluster.servers[0].endpoint
    outcome = run(stream_call(address, method, [UNPARSABLE], hold=True))
    try:
        assert outcome.code not in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), outcome
        assert outcome.code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: no answer in time"
    finally:
        assert_storage_serves(nodes)
        assert_server_serves(nodes)


@fuzz_settings(0.2, io=True)
@given(st.binary(min_size=1, max_size=64), st.sampled_from(sorted(UNARY)))
@example(UNPARSABLE, "/waltz.server.ServerAdminService/AppendRecords")
def test_unary_calls_with_arbitrary_bytes(nodes: Nodes, data: bytes, method: str) -> None:
    outcome = run(unary_call(nodes.cluster.servers[0].endpoint, method, data))
    assert outcome.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), outcome
    if not parses(UNARY[method], data):
        assert outcome.code != grpc.StatusCode.OK, f"{method} accepted bytes that do not parse"


@fuzz_settings(0.2, io=True)
@given(st.binary(min_size=1, max_size=64), st.sampled_from(sorted(STREAMS)))
def test_storage_streams_with_arbitrary_bytes(nodes: Nodes, data: bytes, method: str) -> None:
    """Whatever the bytes, the node answers or ends the call in time, and keeps serving."""
    address = nodes.storage.admin_address if method == STORAGE_ADMIN else nodes.storage.address
    outcome = run(stream_call(address, method, [data]))
    assert outcome.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), outcome
    assert_storage_serves(nodes)


@pytest.mark.parametrize("method", [STORAGE_SESSION, STORAGE_ADMIN, CLIENT_STREAM, *sorted(UNARY)])
def test_an_oversized_message_is_refused_and_the_node_keeps_serving(nodes: Nodes, method: str) -> None:
    address = nodes.cluster.servers[0].endpoint
    if method == STORAGE_SESSION:
        address = nodes.storage.address
    elif method == STORAGE_ADMIN:
        address = nodes.storage.admin_address
    # Field 1 as a length-delimited blob: gRPC checks the size before anything parses it.
    message = b"\x0a" + _varint(OVERSIZED) + b"\0" * OVERSIZED
    if method in UNARY:
        outcome = run(unary_call(address, method, message))
    else:
        outcome = run(stream_call(address, method, [message]))
    assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
    assert str(32 * 1024 * 1024) in outcome.details, outcome.details
    assert_storage_serves(nodes)
    assert_server_serves(nodes)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# ---- well-formed messages with random fields ---------------------------------------------------------

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
SMALL = st.integers(-3, 40)
PARTITION = st.integers(-2, NUM_PARTITIONS + 1) | I32
WIRE_RECORD = st.builds(
    lambda txn, data, good: common_pb2.Record(
        transaction_id=txn,
        req_id=common_pb2.ReqId(client_id=1, generation=1, partition_id=0, seq_num=1),
        data=data,
        checksum=crc32(data) if good else crc32(data) ^ 1,
    ),
    SMALL | I64,
    st.binary(max_size=40),
    st.booleans(),
)


#: Record columns (storage.proto RecordColumns), of equal lengths or not, with good or bad CRCs.
WIRE_COLUMNS = st.integers(0, 3).flatmap(
    lambda n: st.builds(
        storage_pb2.RecordColumns,
        first_transaction_id=SMALL | I64,
        client_ids=st.lists(I32, min_size=n, max_size=n),
        generations=st.lists(I32, min_size=n, max_size=n + 1),
        seq_nums=st.lists(I32, min_size=n, max_size=n),
        headers=st.lists(I32, min_size=max(0, n - 1), max_size=n),
        data=st.lists(st.binary(max_size=20), min_size=n, max_size=n),
        checksums=st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n),
    )
)


@st.composite
def storage_requests(draw: st.DrawFn) -> list[storage_pb2.StorageRequest]:
    bodies = {
        "open_session": st.just(storage_pb2.OpenSessionRequest()),
        "last_session_info": st.just(storage_pb2.LastSessionInfoRequest()),
        "max_transaction_id": st.just(storage_pb2.MaxTransactionIdRequest()),
        "truncate": st.builds(storage_pb2.TruncateRequest, transaction_id=SMALL | I64),
        "set_low_water_mark": st.builds(storage_pb2.SetLowWaterMarkRequest, low_water_mark=SMALL | I64),
        "append": st.builds(storage_pb2.AppendRequest, records=st.lists(WIRE_RECORD, max_size=3))
        | st.builds(storage_pb2.AppendRequest, columns=WIRE_COLUMNS),
        "record_header": st.builds(storage_pb2.RecordHeaderRequest, transaction_id=SMALL | I64),
        "record": st.builds(storage_pb2.RecordRequest, transaction_id=SMALL | I64),
        "record_header_list": st.builds(
            storage_pb2.RecordHeaderListRequest, transaction_id=SMALL | I64, max_records=SMALL | I32
        ),
        "record_list": st.builds(
            storage_pb2.RecordListRequest, transaction_id=SMALL | I64, max_records=SMALL | I32
        ),
        "open": st.builds(
            storage_pb2.OpenRequest, cluster_key=st.text(max_size=40), num_partitions=st.integers(-1, 4)
        ),
        "none": st.none(),
    }
    requests = []
    for seq in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(sorted(bodies)))
        body = draw(bodies[kind])
        request = storage_pb2.StorageRequest(
            session_id=draw(st.integers(-1, 5) | I64), seq_num=seq, partition_id=draw(PARTITION)
        )
        if body is not None:
            getattr(request, kind).CopyFrom(body)
        requests.append(request)
    return requests


@fuzz_settings(0.3, io=True)
@given(storage_requests(), st.booleans())
def test_storage_answers_every_well_formed_request(
    nodes: Nodes, requests: list[storage_pb2.StorageRequest], open_first: bool
) -> None:
    if open_first:
        opening = storage_pb2.StorageRequest(
            session_id=-1,
            seq_num=-1,
            partition_id=-1,
            open=storage_pb2.OpenRequest(cluster_key=nodes.cluster_key, num_partitions=NUM_PARTITIONS),
        )
        requests = [opening, *requests]
    batch = storage_pb2.StorageRequests(requests=requests).SerializeToString()

    def responses_of(answers: list[bytes]) -> list[storage_pb2.StorageResponse]:
        return [r for answer in answers for r in storage_pb2.StorageResponses.FromString(answer).responses]

    outcome = run(
        stream_call(
            nodes.storage.address,
            STORAGE_SESSION,
            [batch],
            hold=True,
            enough=lambda answers: len(responses_of(answers)) >= len(requests),
        )
    )
    responses = responses_of(outcome.answers)
    if outcome.code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
        # The node may end a stream it cannot serve (no open first), but with an error, in time.
        assert outcome.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), outcome
    else:
        # Every request answered once; each partition's requests in order (partitions are served
        # concurrently, so answers of different partitions may interleave; an open request is the
        # stream's, answered at once, whatever partition it names).
        assert sorted(r.seq_num for r in responses) == sorted(r.seq_num for r in requests), outcome
        opens = {r.seq_num for r in requests if r.WhichOneof("body") == "open"}
        for pid in {r.partition_id for r in requests}:
            asked = [r.seq_num for r in requests if r.partition_id == pid and r.seq_num not in opens]
            answered = [r.seq_num for r in responses if r.partition_id == pid and r.seq_num not in opens]
            assert answered == asked, (pid, outcome)
    for response in responses:
        if response.WhichOneof("body") == "failure":
            assert response.failure.exception.message, response
    assert_storage_serves(nodes)


@st.composite
def client_messages(draw: st.DrawFn, generation: int) -> list[client_pb2.ClientMessage]:
    def req_id() -> common_pb2.ReqId:
        return common_pb2.ReqId(
            client_id=draw(st.integers(8000, 8003) | I32.filter(lambda v: v != PROBE_CLIENT)),
            generation=draw(st.sampled_from([generation, generation - 1, generation + 1]) | I32),
            partition_id=draw(st.integers(-1, 2) | I32),
            seq_num=draw(st.integers(0, 10) | I32),
        )

    messages = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(
            st.sampled_from(
                ["mount", "append", "appends", "feed", "flush", "high_water_mark", "unmount", "none"]
            )
        )
        message = client_pb2.ClientMessage()
        if kind == "mount":
            message.mount.CopyFrom(
                client_pb2.MountRequest(
                    req_id=req_id(), client_high_water_mark=draw(SMALL | I64), seq_num=draw(SMALL)
                )
            )
        elif kind == "append":
            data = draw(st.binary(max_size=40))
            message.append.CopyFrom(
                client_pb2.AppendRequest(
                    req_id=req_id(),
                    client_high_water_mark=draw(SMALL | I64),
                    write_lock_hashes=draw(st.lists(I32, max_size=3)),
                    read_lock_hashes=draw(st.lists(I32, max_size=3)),
                    append_lock_hashes=draw(st.lists(I32, max_size=3)),
                    header=draw(I32),
                    data=data,
                    checksum=crc32(data) if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1)),
                )
            )
        elif kind == "appends":
            # Columns of random lengths (usually consistent, as a client sends them), counts
            # that may not add up to the hashes.
            rows = draw(st.integers(0, 3))
            length = st.sampled_from([rows, rows, rows, rows + 1, max(rows - 1, 0)])
            column_data = draw(st.lists(st.binary(max_size=20), min_size=rows, max_size=rows))
            appends = message.appends
            ids = req_id()
            appends.client_id, appends.generation = ids.client_id, ids.generation
            appends.partition_id = ids.partition_id
            appends.seq_nums.extend(draw(st.lists(SMALL, min_size=rows, max_size=rows)))
            marks = draw(st.lists(SMALL | I64, min_size=rows + 1, max_size=rows + 1))
            appends.client_high_water_marks.extend(marks[: draw(length)])
            appends.headers.extend(draw(st.lists(I32, min_size=rows + 1, max_size=rows + 1))[: draw(length)])
            appends.data.extend(column_data[: draw(length)])
            appends.checksums.extend(
                crc32(d) if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1)) for d in column_data
            )
            for counts, hashes in (
                (appends.write_lock_counts, appends.write_lock_hashes),
                (appends.read_lock_counts, appends.read_lock_hashes),
                (appends.append_lock_counts, appends.append_lock_hashes),
            ):
                counts.extend(draw(st.lists(st.integers(0, 2), max_size=rows + 1)))
                hashes.extend(draw(st.lists(I32, max_size=4)))
        elif kind == "feed":
            message.feed.CopyFrom(
                client_pb2.FeedRequest(req_id=req_id(), client_high_water_mark=draw(SMALL | I64))
            )
        elif kind == "flush":
            message.flush.CopyFrom(client_pb2.FlushRequest(req_id=req_id()))
        elif kind == "high_water_mark":
            message.high_water_mark.CopyFrom(client_pb2.HighWaterMarkRequest(req_id=req_id()))
        elif kind == "unmount":
            message.unmount.CopyFrom(client_pb2.UnmountRequest(req_id=req_id(), seq_num=draw(SMALL)))
        messages.append(message)
    return messages


@fuzz_settings(0.2, io=True)
@given(st.data())
def test_server_keeps_a_stream_with_malformed_messages_open(nodes: Nodes, data: st.DataObject) -> None:
    owner = nodes.cluster.wait_ready(60)[0]
    messages = data.draw(client_messages(owner.generation))
    # A mount of a client the random messages never use, last: its answer proves that the stream
    # is still served after everything before it.
    probe_id = common_pb2.ReqId(
        client_id=PROBE_CLIENT, generation=owner.generation, partition_id=0, seq_num=1
    )
    probe = client_pb2.ClientMessage(
        mount=client_pb2.MountRequest(
            req_id=probe_id, client_high_water_mark=owner.high_water_mark, seq_num=1
        )
    )
    batches = [client_pb2.ClientMessages(messages=[m]).SerializeToString() for m in [*messages, probe]]

    async def scenario() -> list[client_pb2.ServerMessage]:
        channel = grpc.aio.insecure_channel(owner.endpoint)
        call = channel.stream_stream(CLIENT_STREAM)(_hold(batches), timeout=ANSWER_TIMEOUT)
        received: list[client_pb2.ServerMessage] = []
        try:
            while True:
                answer = await call.read()
                assert answer is not grpc.aio.EOF, f"the server ended the stream; received {received}"
                received += client_pb2.ServerMessages.FromString(answer).messages
                if any(m.WhichOneof("body") == "mount" and m.mount.req_id == probe_id for m in received):
                    return received
        except grpc.aio.AioRpcError as error:
            raise AssertionError(
                f"the stream failed with {error.code()}: {error.details()}; {received}"
            ) from None
        finally:
            call.cancel()
            await channel.close(None)

    received = run(scenario())
    for message in received:
        if message.WhichOneof("body") == "error":
            assert message.error.message, message
    assert_server_serves(nodes)


async def _hold(batches: list[bytes]):  # type: ignore[no-untyped-def]
    for batch in batches:
        yield batch
    await asyncio.sleep(ANSWER_TIMEOUT)  # keep the request side open, as a real client does
