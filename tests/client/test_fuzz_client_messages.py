"""Fuzzing what a client does with the messages a server sends: arbitrary, out of order, absurd.

A bad or buggy server (or a stale connection) can send feed entries that jump or repeat, runs of
feed entries whose columns differ in length, lock failures and flush responses for requests never
made, mount responses with other ReqIds, errors and suspensions at any time. Whatever arrives, the
client partition must not raise, and what it hands to ``apply_transaction`` must stay a contiguous
run of transaction IDs from its mark, each once: the feed's contiguity check is the client's last
line of defence.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.feed import feed_run
from support.fuzz_settings import fuzz_settings

from waltz import Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz.client.client_partition import ClientPartition
from waltz.client.context import AppendPayload
from waltz.client.mount_procedure import PartitionState
from waltz.client.submission import Submission
from waltz.client.transaction_data import (
    MalformedDataResponseError,
    _TransientDataError,
    check_range_response,
)
from waltz.protocol import client_pb2, common_pb2
from waltz.protocol.records import ReqId, crc32

pytestmark = pytest.mark.fuzz

CLIENT = 7
MARK = 5


class Recorder(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.applied: list[int] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return MARK

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.lock:
            self.applied.append(transaction.transaction_id)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise AssertionError(f"apply failed: {exception!r}")


class Connection:
    def __init__(self, seq_num: int) -> None:
        self.endpoint = "server:1"
        self.seq_num = seq_num
        self.closed = False
        self.sent: list[Any] = []

    def send(self, message: client_pb2.ClientMessage) -> None:
        self.sent.append(message)

    def send_append(
        self,
        req_id: ReqId,
        payload: AppendPayload,
        linger: float = 0.0,
        traceparent: str = "",
        epoch: int = 0,
    ) -> None:
        self.sent.append((req_id, payload, linger))


class Host:
    """The partition's client: records outcomes instead of acting on them."""

    def __init__(self, callbacks: Recorder) -> None:
        self.client_id = CLIENT
        self.callbacks = callbacks
        self.data_source: Any = None
        self.seq = 0
        self.connections: list[Connection] = []
        self.outcomes: list[tuple[str, object]] = []

    def next_seq_num(self) -> int:
        self.seq += 1
        return self.seq

    async def connection(self, endpoint: str) -> Any:
        if not self.connections or self.connections[-1].closed:
            self.connections.append(Connection(len(self.connections) + 1))
        return self.connections[-1]

    def completed(self, submission: Submission, transaction_id: int) -> None:
        self.outcomes.append(("completed", transaction_id))

    def retry(self, submission: Submission, lock_target: int | None) -> None:
        self.outcomes.append(("retry", lock_target))

    def rejected(self, submission: Submission, error: BaseException) -> None:
        self.outcomes.append(("rejected", error))

    def refresh_assignment(self) -> None:
        self.outcomes.append(("refresh", None))

    async def previous_apply_ended(self, partition_id: int) -> None:
        pass


class Data(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(b"x")
        return True


INTS = st.integers(-3, 40)
REQ_IDS = st.builds(
    lambda client, generation, seq: common_pb2.ReqId(
        client_id=client, generation=generation, partition_id=0, seq_num=seq
    ),
    st.sampled_from([CLIENT, 8, -1]),
    st.integers(0, 3),
    st.integers(-1, 12),
)


def _feed_entries(first: int, req_ids: list[common_pb2.ReqId], drop: int | None) -> client_pb2.FeedEntries:
    """A run of feed entries; ``drop`` removes one column's last element (a malformed run)."""
    run = feed_run(first, req_ids, [1] * len(req_ids))
    if drop is not None and req_ids:
        column = (run.client_ids, run.generations, run.seq_nums, run.headers)[drop]
        del column[-1]
    return run


def _message(kind: str) -> Any:
    if kind == "feed_entries":
        return st.builds(
            _feed_entries,
            INTS,
            st.lists(REQ_IDS, max_size=4),
            st.one_of(st.none(), st.none(), st.none(), st.integers(0, 3)),
        )
    if kind == "lock_failure":
        return st.builds(lambda r, t: client_pb2.LockFailure(req_id=r, transaction_id=t), REQ_IDS, INTS)
    if kind == "flush":
        return st.builds(lambda r, t: client_pb2.FlushResponse(req_id=r, transaction_id=t), REQ_IDS, INTS)
    if kind == "mount":
        return st.builds(
            lambda r, ok: client_pb2.MountResponse(req_id=r, partition_ready=ok), REQ_IDS, st.booleans()
        )
    if kind == "error":
        return st.builds(lambda r: client_pb2.ServerError(req_id=r, message="fuzz"), REQ_IDS)
    return st.builds(lambda r: client_pb2.FeedSuspended(req_id=r), REQ_IDS)


KINDS = ("feed_entries", "lock_failure", "flush", "mount", "error", "feed_suspended")
MESSAGES = st.one_of(
    *(st.tuples(st.just(kind), _message(kind)) for kind in KINDS),
    st.just(("contiguous", None)),  # a well-behaved entry now and then: the feed can progress
)


@fuzz_settings(0.5, io=True)
@given(st.lists(MESSAGES, max_size=60), st.integers(0, 4))
def test_any_server_messages_leave_the_applied_sequence_contiguous(
    messages: list[tuple[str, Any]], appends: int
) -> None:
    async def scenario() -> None:
        callbacks = Recorder()
        host = Host(callbacks)
        partition = ClientPartition(0, host, host, max_apply_batch=10)  # type: ignore[arg-type]
        try:
            partition.set_placement("server:1", 1)
            partition.mount()
            for _ in range(200):  # the mount request goes out on the loop
                if host.connections and host.connections[-1].sent:
                    break
                await asyncio.sleep(0.001)
            connection = host.connections[-1]
            request = connection.sent[0].mount
            partition.on_message(  # type: ignore[arg-type]
                connection, "mount", client_pb2.MountResponse(req_id=request.req_id, partition_ready=True)
            )
            await asyncio.sleep(0)
            for _ in range(appends):
                submission = Submission(Data(), 0, lambda _: MARK, 1 << 20)
                payload = submission.attempt()
                assert payload is not None
                partition.send_append(submission, payload)
            next_id = MARK + 1
            for kind, body in messages:
                connection = host.connections[-1]
                if kind == "contiguous":
                    other = common_pb2.ReqId(client_id=8, generation=1, partition_id=0, seq_num=1)
                    entry = _feed_entries(next_id, [other], None)
                    next_id += 1
                    partition.on_feed_entries(connection, entry)  # type: ignore[arg-type]
                    partition.end_of_batch()
                elif kind == "feed_entries":
                    partition.on_feed_entries(connection, body)  # type: ignore[arg-type]
                    partition.end_of_batch()
                else:
                    partition.on_message(connection, kind, body)  # type: ignore[arg-type]
                await asyncio.sleep(0)
            worker = partition.worker
            if worker is not None:
                for _ in range(2000):
                    if worker.backlog == 0:
                        break
                    await asyncio.sleep(0.001)
            applied = list(callbacks.applied)
            assert applied == list(range(MARK + 1, MARK + 1 + len(applied))), applied
            assert partition.state is not PartitionState.CLOSED
        finally:
            worker, _ = partition.close()
            if worker is not None:
                await asyncio.to_thread(worker.close)

    asyncio.run(scenario())


@st.composite
def data_range_answers(draw: st.DrawFn) -> tuple[int, int, client_pb2.TransactionDataRangeResponse]:
    """A request (first ID, count) and an answer to it: mostly well formed, sometimes subtly not."""
    first = draw(st.integers(-1, 2**40))
    count = draw(st.integers(1, 20))
    datas = draw(st.lists(st.binary(max_size=64), max_size=count + 3))
    checksums = [crc32(d) for d in datas]
    if checksums and draw(st.booleans()):
        i = draw(st.integers(0, len(checksums) - 1))
        checksums[i] = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 4)) == 0:
        checksums = checksums[: draw(st.integers(0, len(checksums)))] + draw(
            st.lists(st.integers(0, 2**32 - 1), max_size=2)
        )
    answered_first = first if draw(st.integers(0, 3)) else draw(st.integers(-(2**63), 2**63 - 1))
    response = client_pb2.TransactionDataRangeResponse(
        first_transaction_id=answered_first,
        success=draw(st.integers(0, 5)) > 0,
        data=datas,
        checksums=checksums,
        error_message=draw(st.text(max_size=20)),
    )
    return first, count, response


@fuzz_settings()
@given(data_range_answers())
def test_any_transaction_data_answer_is_returned_whole_and_checked_or_refused(
    answer: tuple[int, int, client_pb2.TransactionDataRangeResponse],
) -> None:
    """What the client takes from a data-range answer is a run of 1..count transactions from the ID
    asked, each matching its CRC-32; anything else is refused with an error naming the server."""
    first, count, response = answer
    try:
        page = check_range_response("server-9:7000", response, first, count)
    except MalformedDataResponseError as exc:
        assert "server-9:7000" in str(exc)
        assert response.success
        return
    except _TransientDataError as exc:
        assert not response.success and "server-9:7000" in str(exc)
        return
    assert response.success and response.first_transaction_id == first
    assert 1 <= len(page) <= count and page == list(response.data)
    assert [crc32(d) for d in page] == list(response.checksums)
