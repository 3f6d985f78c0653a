"""Fuzzing what a server does with the answers of a storage node: arbitrary, lying, out of order.

A real gRPC server on loopback plays a broken (or malicious) storage node: it accepts the open
and open-session requests, then answers every request of the replica session with a response
drawn by hypothesis: any body kind (not always the one asked for), failure codes this version
does not know, marks below -1, record lists that skip, repeat, overflow the read or carry data
that fails its CRC-32, wrong sequence numbers (the answer never matches, the request times out),
or no answer at all.

Whatever it sends, :class:`~waltz.services.server.store.replica.ReplicaConnection` (what a store
session, a recovery and a catch-up copy use) either returns a value that could be true (records
contiguous from the ID asked, no more than asked, each CRC-checked; marks -1 or more) or raises
:class:`ReplicaError`, which takes the replica out of the session. Nothing else escapes: no
``ValueError`` from an unknown enum value, no ``AttributeError``, no hang. Design:
docs/design/storage.md "Storage requests"; docs/design/server.md "Store sessions".
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz_settings import fuzz_settings
from support.storage import run

from waltz.local.processes import free_port
from waltz.protocol import common_pb2, storage_pb2, storage_pb2_grpc
from waltz.protocol.records import Record, ReqId, crc32
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError

pytestmark = pytest.mark.fuzz

PARTITION = 0
SESSION = 5
#: The first transaction ID every fuzzed read asks for.
FIRST = 10
MAX_RECORDS = 4
#: Seconds a fuzzed request waits for its answer (the unmatched ones time out).
REQUEST_TIMEOUT = 0.3
BODIES = (
    "success",
    "failure",
    "last_session_info",
    "max_transaction_id",
    "record_header",
    "record",
    "record_header_list",
    "record_list",
)
OPERATIONS = (
    "records",
    "max_transaction_id",
    "last_session_info",
    "truncate",
    "set_low_water_mark",
    "append",
)


@dataclass
class Script:
    """What the fake storage node answers next (set by each example)."""

    answer: storage_pb2.StorageResponse | None = None
    """The answer to every request after the open; None: never answer."""
    echo_seq: bool = True
    """Answer with the request's sequence number (False: the answer's own, which matches nothing)."""
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def respond(self, request: storage_pb2.StorageRequest) -> storage_pb2.StorageResponse | None:
        kind = request.WhichOneof("body")
        with self.lock:
            self.requests.append(kind or "?")
            answer, echo = self.answer, self.echo_seq
        if kind in ("open", "open_session"):
            # The stream's open and the replica session's (ReplicaConnection.open) succeed.
            response = storage_pb2.StorageResponse(success=storage_pb2.SuccessResponse())
        elif answer is None:
            return None
        else:
            response = storage_pb2.StorageResponse()
            response.CopyFrom(answer)
            if not echo:
                return response
        response.seq_num = request.seq_num
        response.session_id = request.session_id
        response.partition_id = request.partition_id
        return response


class FakeStorage(storage_pb2_grpc.StorageServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

    def Session(  # the servicer method gRPC calls
        self, request_iterator: Iterator[Any], context: Any
    ) -> Iterator[storage_pb2.StorageResponses]:
        for batch in request_iterator:
            responses = [r for r in (self.script.respond(req) for req in batch.requests) if r is not None]
            if responses:
                yield storage_pb2.StorageResponses(responses=responses)


@dataclass(frozen=True)
class Node:
    address: str
    script: Script


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    script = Script()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    storage_pb2_grpc.add_StorageServiceServicer_to_server(FakeStorage(script), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield Node(f"127.0.0.1:{port}", script)
    finally:
        server.stop(grace=None)


def _connection(address: str) -> ReplicaConnection:
    return ReplicaConnection(
        address,
        PARTITION,
        SESSION,
        str(uuid.uuid4()),
        2,
        StoreConfig(connect_timeout=5.0, request_timeout=REQUEST_TIMEOUT),
    )


async def _drive(address: str, operation: str) -> Any:
    connection = _connection(address)
    try:
        await connection.open()
        if operation == "records":
            return await connection.records(FIRST, MAX_RECORDS)
        if operation == "max_transaction_id":
            return await connection.max_transaction_id()
        if operation == "last_session_info":
            return await connection.last_session_info()
        if operation == "truncate":
            return await connection.truncate(FIRST)
        if operation == "set_low_water_mark":
            return await connection.set_low_water_mark(FIRST)
        record = Record.create(FIRST, ReqId(1, 1, PARTITION, 1), 0, b"x")
        return await connection.start_append(
            storage_pb2.AppendRequest(records=[record.to_proto()]).SerializeToString()
        )
    finally:
        await connection.close()


def _check_result(operation: str, result: Any) -> None:
    """A value that a ReplicaConnection returned must be one that could be true."""
    if operation == "records":
        assert len(result) <= MAX_RECORDS
        assert [r.transaction_id for r in result] == list(range(FIRST, FIRST + len(result)))
        assert all(r.checksum_ok() for r in result)
    elif operation in ("max_transaction_id", "truncate"):
        assert isinstance(result, int) and result >= -1
    elif operation == "last_session_info":
        session_id, low_water_mark = result
        assert session_id >= -1 and low_water_mark >= -1
    else:
        assert result is None


def _good_records(count: int) -> list[common_pb2.Record]:
    return [
        Record.create(FIRST + i, ReqId(1, 1, PARTITION, i + 1), i, bytes([i]) * 8).to_proto()
        for i in range(count)
    ]


@st.composite
def record_lists(draw: st.DrawFn) -> list[common_pb2.Record]:
    count = draw(st.integers(0, MAX_RECORDS + 2))
    contiguous = draw(st.booleans())
    records = []
    for i in range(count):
        transaction_id = FIRST + i if contiguous else draw(st.integers(-2, 1 << 40))
        data = draw(st.binary(max_size=32))
        checksum = crc32(data) if draw(st.booleans()) else draw(st.integers(0, (1 << 32) - 1))
        records.append(
            common_pb2.Record(
                transaction_id=transaction_id,
                req_id=common_pb2.ReqId(client_id=1, generation=1, partition_id=PARTITION, seq_num=i),
                header=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
                data=data,
                checksum=checksum,
            )
        )
    return records


@st.composite
def responses(draw: st.DrawFn) -> storage_pb2.StorageResponse:
    kind = draw(st.sampled_from(BODIES))
    response = storage_pb2.StorageResponse()
    marks = st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-3, 3)
    if kind == "success":
        response.success.SetInParent()
    elif kind == "failure":
        response.failure.exception.code = draw(st.integers(0, 12) | st.integers(-(1 << 31), (1 << 31) - 1))
        response.failure.exception.message = draw(st.text(max_size=40))
    elif kind == "last_session_info":
        response.last_session_info.session_info.session_id = draw(marks)
        response.last_session_info.session_info.low_water_mark = draw(marks)
    elif kind == "max_transaction_id":
        response.max_transaction_id.transaction_id = draw(marks)
    elif kind == "record_header":
        response.record_header.SetInParent()
    elif kind == "record":
        records = draw(record_lists())
        if records:
            response.record.record.CopyFrom(records[0])
        else:
            response.record.SetInParent()
    elif kind == "record_header_list":
        response.record_header_list.SetInParent()
    else:
        response.record_list.records.extend(draw(record_lists()))
    return response


@fuzz_settings(0.5, io=True)
@given(
    operation=st.sampled_from(OPERATIONS),
    answer=st.none() | responses(),
    echo_seq=st.sampled_from([True, True, True, False]),
)
@example(
    operation="records",
    answer=storage_pb2.StorageResponse(record_list={"records": _good_records(3)}),
    echo_seq=True,
)
def test_any_storage_answer_is_a_plausible_value_or_a_replica_error(
    node: Node, operation: str, answer: storage_pb2.StorageResponse | None, echo_seq: bool
) -> None:
    with node.script.lock:
        node.script.answer, node.script.echo_seq = answer, echo_seq
    try:
        result = run(asyncio.wait_for(_drive(node.address, operation), 20.0))
    except ReplicaError as exc:
        assert exc.storage == node.address
        assert str(PARTITION) in str(exc)
        return
    _check_result(operation, result)


# --- the same checks on chosen answers: each is caught, and named ---------------------------------


def _answer(node: Node, response: storage_pb2.StorageResponse | None, echo_seq: bool = True) -> None:
    with node.script.lock:
        node.script.answer, node.script.echo_seq = response, echo_seq


def _failing(node: Node, operation: str) -> ReplicaError:
    with pytest.raises(ReplicaError) as caught:
        run(_drive(node.address, operation))
    return caught.value


def test_a_good_record_list_is_returned_whole(node: Node) -> None:
    _answer(node, storage_pb2.StorageResponse(record_list={"records": _good_records(3)}))
    records = run(_drive(node.address, "records"))
    assert [(r.transaction_id, r.data) for r in records] == [(FIRST + i, bytes([i]) * 8) for i in range(3)]


def test_a_record_whose_data_fails_its_crc_is_a_bad_response(node: Node) -> None:
    records = _good_records(3)
    records[1].data = b"tampered"
    _answer(node, storage_pb2.StorageResponse(record_list={"records": records}))
    error = _failing(node, "records")
    assert error.code == "BAD_RESPONSE"
    assert f"record {FIRST + 1} has data that does not match its CRC-32" in str(error)


def test_records_out_of_sequence_or_too_many_are_bad_responses(node: Node) -> None:
    skipping = _good_records(3)
    del skipping[1]
    _answer(node, storage_pb2.StorageResponse(record_list={"records": skipping}))
    skipped = f"record {FIRST + 2} where the read from {FIRST} expected {FIRST + 1}"
    assert skipped in str(_failing(node, "records"))
    _answer(node, storage_pb2.StorageResponse(record_list={"records": _good_records(MAX_RECORDS + 1)}))
    too_many = f"{MAX_RECORDS + 1} records answer a read of at most {MAX_RECORDS}"
    assert too_many in str(_failing(node, "records"))


def test_an_unknown_failure_code_is_named_not_raised(node: Node) -> None:
    response = storage_pb2.StorageResponse()
    response.failure.exception.code = 999
    response.failure.exception.message = "from the future"
    _answer(node, response)
    error = _failing(node, "max_transaction_id")
    assert error.code == "UNKNOWN_FAILURE_CODE_999"
    assert "from the future" in str(error)


def test_an_answer_of_another_kind_is_a_bad_response(node: Node) -> None:
    _answer(node, storage_pb2.StorageResponse(record_list={"records": _good_records(1)}))
    error = _failing(node, "max_transaction_id")
    assert error.code == "BAD_RESPONSE"
    assert "answered a max_transaction_id request" in str(error) and "with record_list" in str(error)
    _answer(node, storage_pb2.StorageResponse(max_transaction_id={"transaction_id": 3}))
    error = _failing(node, "append")
    assert error.code == "BAD_RESPONSE" and "not success" in str(error)


def test_a_mark_below_minus_one_is_a_bad_response(node: Node) -> None:
    _answer(node, storage_pb2.StorageResponse(max_transaction_id={"transaction_id": -7}))
    assert "max transaction ID -7" in str(_failing(node, "max_transaction_id"))
    _answer(
        node,
        storage_pb2.StorageResponse(
            last_session_info={"session_info": {"session_id": 4, "low_water_mark": -2}}
        ),
    )
    assert "low-water mark -2" in str(_failing(node, "last_session_info"))


def test_an_answer_that_never_comes_times_out_as_unavailable(node: Node) -> None:
    for response, echo in ((None, True), (storage_pb2.StorageResponse(success={}), False)):
        _answer(node, response, echo)
        error = _failing(node, "set_low_water_mark")
        assert error.code == "UNAVAILABLE"
