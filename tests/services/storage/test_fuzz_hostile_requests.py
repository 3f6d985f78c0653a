"""Fuzzing a real storage node with well-formed requests carrying hostile values.

Storage requests on the storage port and admin requests on the admin port, each well-formed but
with a value no honest peer sends: store session IDs 0, negative, 2^63-1 or further above the
fence than ``storage.fence.maxJump``; partition IDs out of range or not assigned; record counts
and transaction IDs huge or negative. Every request is answered with a failure response carrying
a known code and a message; afterwards no fence has moved, the records are intact and the node
still serves (docs/design/storage.md "Fencing by store session ID", "Storage requests", "Admin
port").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import support
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings
from support.storage import NUM_PARTITIONS, run

from waltz.errors import StorageRpcError
from waltz.local.nodes import LocalStorageNode
from waltz.protocol import common_pb2, storage_pb2
from waltz.protocol.records import Record, ReqId, crc32
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient
from waltz.services.storage.storage_partition import DEFAULT_MAX_FENCE_JUMP

pytestmark = pytest.mark.fuzz

#: The store session that owns partitions 0 and 1 of the fuzzed node.
FENCE = 5
#: The records partition 0 holds (written by session FENCE, which then set its low-water mark).
RECORDS = [Record.create(t, ReqId(1, 1, 0, t), 0, f"kept {t}".encode()) for t in range(10)]
LOW_WATER_MARK = 9
#: Seconds a node has to answer.
ANSWER_TIMEOUT = 10.0

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
#: Session IDs no request may use to raise the fence of a partition at FENCE.
HOSTILE_SESSION = (
    st.sampled_from([0, -1, -(2**63), 2**63 - 1, FENCE - 1, FENCE + DEFAULT_MAX_FENCE_JUMP + 1])
    | st.integers(-(2**63), FENCE - 1)
    | st.integers(FENCE + DEFAULT_MAX_FENCE_JUMP + 1, 2**63 - 1)
)
#: Session IDs above the fence but within the bound: a read from one is refused all the same.
OPENABLE_SESSION = st.integers(FENCE + 1, FENCE + DEFAULT_MAX_FENCE_JUMP)
#: Partitions the node does not serve: out of the cluster's range, or not assigned (2, 3).
HOSTILE_PARTITION = (
    st.sampled_from([-1, -(2**31), 2, 3, NUM_PARTITIONS, 2**31 - 1])
    | st.integers(-(2**31), -1)
    | st.integers(NUM_PARTITIONS, 2**31 - 1)
)
COUNT = st.sampled_from([0, -1, 2**31 - 1, -(2**31)]) | I32
OFFSET = st.sampled_from([-2, -1, 0, 10, 2**63 - 1, -(2**63)]) | I64
READS = (
    "last_session_info",
    "max_transaction_id",
    "record_header",
    "record",
    "record_header_list",
    "record_list",
)
WRITES = ("open_session", "truncate", "set_low_water_mark", "append")
STORAGE_CODES = {
    "SESSION_FENCED",
    "SESSION_NOT_OPEN",
    "SESSION_JUMP_TOO_LARGE",
    "INVALID_REQUEST",
    "PARTITION_NOT_ASSIGNED",
}
ADMIN_CODES = {"INVALID_REQUEST", "PARTITION_NOT_ASSIGNED"}


@dataclass(frozen=True)
class Node:
    storage: LocalStorageNode
    cluster_key: str


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    directory = tmp_path_factory.mktemp("fuzz-hostile")
    key = str(uuid.uuid4())
    with LocalStorageNode(
        directory / "storage", name="hostile", log_path=directory / "storage.log", insecure=True
    ) as storage:

        async def init() -> None:
            async with StorageAdminClient(storage.admin_address, key, NUM_PARTITIONS) as admin:
                await admin.assign_partition(0, True)
                await admin.assign_partition(1, True)
            async with StorageSessionClient(storage.address, key, NUM_PARTITIONS, FENCE) as owner:
                await owner.open_session(0)
                await owner.open_session(1)
                await owner.append(0, RECORDS)
                await owner.set_low_water_mark(0, LOW_WATER_MARK)

        run(init())
        yield Node(storage, key)


@pytest.fixture(autouse=True)
def _logs(request: pytest.FixtureRequest, node: Node) -> None:
    support.add_failure_logs(request.node, "fuzzed storage log", node.storage.process.log_tail)


def assert_untouched(node: Node) -> None:
    """No fence moved, partition 0's records and marks are intact, and the node serves."""
    assert node.storage.process.is_running(), f"the storage node died:\n{node.storage.process.log_tail()}"

    async def check() -> None:
        async with StorageAdminClient(node.storage.admin_address, node.cluster_key, NUM_PARTITIONS) as admin:
            status = {p.partition_id: p for p in (await admin.partition_status()).partitions}
            assert sorted(status) == [0, 1]
            assert [status[p].session_id for p in (0, 1)] == [FENCE, FENCE]
            assert (status[0].last_session_id, status[0].low_water_mark) == (FENCE, LOW_WATER_MARK)
            assert (status[0].max_transaction_id, status[1].max_transaction_id) == (9, -1)
            assert (status[0].readable, status[0].writable) == (True, True)
            assert await admin.records(0, 0, 100) == RECORDS

    run(asyncio.wait_for(check(), ANSWER_TIMEOUT))
    # No hostile request created (or removed) a partition directory.
    assert sorted(p.name for p in node.storage.directory.iterdir() if p.is_dir()) == ["0", "1"]


# ---- storage requests ---------------------------------------------------------------------------------


def _body(draw: st.DrawFn, kind: str, *, must_fail: bool = False) -> Any:
    """A request body of ``kind``; with ``must_fail`` one that fails even for the owner."""
    if kind in ("open_session", "last_session_info", "max_transaction_id"):
        return {
            "open_session": storage_pb2.OpenSessionRequest,
            "last_session_info": storage_pb2.LastSessionInfoRequest,
            "max_transaction_id": storage_pb2.MaxTransactionIdRequest,
        }[kind]()
    if kind == "truncate":
        return storage_pb2.TruncateRequest(
            transaction_id=draw(st.integers(-(2**63), -2) if must_fail else OFFSET)
        )
    if kind == "set_low_water_mark":
        return storage_pb2.SetLowWaterMarkRequest(low_water_mark=draw(OFFSET))
    if kind == "append":
        first = draw(OFFSET.filter(lambda t: t != len(RECORDS)) if must_fail else OFFSET)
        count = draw(st.integers(1, 3))
        records = []
        for i in range(count):
            data = draw(st.binary(max_size=20))
            records.append(
                common_pb2.Record(
                    transaction_id=max(-(2**63), min(2**63 - 1, first + i)),
                    req_id=common_pb2.ReqId(client_id=1, generation=1, partition_id=0, seq_num=i),
                    data=data,
                    checksum=crc32(data),
                )
            )
        return storage_pb2.AppendRequest(records=records)
    if kind in ("record_header", "record"):
        message = storage_pb2.RecordHeaderRequest if kind == "record_header" else storage_pb2.RecordRequest
        return message(transaction_id=draw(OFFSET))
    message = (
        storage_pb2.RecordHeaderListRequest if kind == "record_header_list" else storage_pb2.RecordListRequest
    )
    count = draw(st.integers(-(2**31), 0) if must_fail else COUNT)
    return message(transaction_id=draw(OFFSET), max_records=count)


@st.composite
def hostile_storage_requests(draw: st.DrawFn) -> storage_pb2.StorageRequest:
    """One well-formed storage request that must fail: a partition not served here, a session
    that may not touch the partition, or the owner's session with a value that cannot be right."""
    mode = draw(st.sampled_from(["partition", "session", "read above the fence", "value"]))
    if mode == "partition":
        kind = draw(st.sampled_from(READS + WRITES))
        partition, session = draw(HOSTILE_PARTITION), draw(st.just(FENCE) | HOSTILE_SESSION)
        body = _body(draw, kind)
    elif mode == "session":
        kind = draw(st.sampled_from(READS + WRITES))
        partition, session = draw(st.sampled_from([0, 1])), draw(HOSTILE_SESSION)
        body = _body(draw, kind)
    elif mode == "read above the fence":
        kind = draw(st.sampled_from(READS))
        partition, session = draw(st.sampled_from([0, 1])), draw(OPENABLE_SESSION)
        body = _body(draw, kind)
    else:
        kind = draw(st.sampled_from(["truncate", "append", "record_header_list", "record_list"]))
        partition, session = 0, FENCE
        body = _body(draw, kind, must_fail=True)
    request = storage_pb2.StorageRequest(session_id=session, partition_id=partition)
    getattr(request, kind).CopyFrom(body)
    return request


@fuzz_settings(0.3, io=True)
@given(hostile_storage_requests())
@example(
    storage_pb2.StorageRequest(
        session_id=2**63 - 1, partition_id=0, last_session_info=storage_pb2.LastSessionInfoRequest()
    )
)
@example(
    storage_pb2.StorageRequest(
        session_id=2**63 - 1,
        partition_id=0,
        record_list=storage_pb2.RecordListRequest(transaction_id=0, max_records=2**31 - 1),
    )
)
@example(
    storage_pb2.StorageRequest(
        session_id=2**63 - 1, partition_id=1, open_session=storage_pb2.OpenSessionRequest()
    )
)
@example(
    storage_pb2.StorageRequest(
        session_id=0, partition_id=0, truncate=storage_pb2.TruncateRequest(transaction_id=-1)
    )
)
@example(
    storage_pb2.StorageRequest(
        session_id=FENCE, partition_id=2**31 - 1, set_low_water_mark=storage_pb2.SetLowWaterMarkRequest()
    )
)
def test_hostile_storage_requests_are_refused_and_leave_no_trace(
    node: Node, request: storage_pb2.StorageRequest
) -> None:
    async def send() -> storage_pb2.StorageResponse:
        async with StorageSessionClient(node.storage.address, node.cluster_key, NUM_PARTITIONS) as client:
            return await client.submit(request)

    response = run(asyncio.wait_for(send(), ANSWER_TIMEOUT))
    assert response.WhichOneof("body") == "failure", (request, response)
    exception = response.failure.exception
    assert storage_pb2.FailureCode.Name(exception.code) in STORAGE_CODES, (request, exception)
    assert exception.message
    assert (response.seq_num, response.partition_id) == (request.seq_num, request.partition_id)
    assert_untouched(node)


# ---- admin requests -----------------------------------------------------------------------------------


AdminCall = Callable[[StorageAdminClient], Awaitable[object]]


@st.composite
def hostile_admin_calls(draw: st.DrawFn) -> tuple[str, AdminCall]:
    """One admin request that must fail: a partition not served here (out of range for an
    assignment), a record count below one, or a fence below -1."""
    partition = draw(HOSTILE_PARTITION)
    out_of_range = draw(
        st.integers(-(2**31), -1)
        | st.integers(NUM_PARTITIONS, 2**31 - 1)
        | st.sampled_from([-1, NUM_PARTITIONS])
    )
    offset, count, flag = draw(OFFSET), draw(COUNT), draw(st.booleans())
    fence, low_fence = draw(I64), draw(st.integers(-(2**63), -2))
    below_one, owned = draw(st.integers(-(2**31), 0)), draw(st.sampled_from([0, 1]))
    calls: dict[str, AdminCall] = {
        "records": lambda a: a.records(partition, offset, count),
        "records with a count below one": lambda a: a.records(owned, offset, below_one),
        "last_session_info": lambda a: a.last_session_info(partition),
        "max_transaction_id": lambda a: a.max_transaction_id(partition),
        "set_readable": lambda a: a.set_readable(partition, flag),
        "set_writable": lambda a: a.set_writable(partition, flag),
        "partition_status": lambda a: a.partition_status(partition if partition != -1 else -2),
        "assign_partition": lambda a: a.assign_partition(out_of_range, flag, delete_storage_files=True),
        "set_fence": lambda a: a.set_fence(partition, fence),
        "set_fence below -1": lambda a: a.set_fence(owned, low_fence),
    }
    name = draw(st.sampled_from(sorted(calls)))
    return f"{name} (partition {partition}, out of range {out_of_range})", calls[name]


@fuzz_settings(0.3, io=True)
@given(hostile_admin_calls())
def test_hostile_admin_requests_are_refused_and_leave_no_trace(
    node: Node, call: tuple[str, AdminCall]
) -> None:
    what, work = call

    async def send() -> None:
        async with StorageAdminClient(node.storage.admin_address, node.cluster_key, NUM_PARTITIONS) as admin:
            await work(admin)

    with pytest.raises(StorageRpcError) as info:
        run(asyncio.wait_for(send(), ANSWER_TIMEOUT))
    assert info.value.code in ADMIN_CODES, (what, info.value)
    assert info.value.remote_message, what
    assert_untouched(node)
