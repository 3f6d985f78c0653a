"""The client partition's protocol logic against a scripted server, without a network.

Design: docs/design/client.md "Appends, the feed and flush".
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import settle
from support.feed import feed_run

from waltz import (
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
)
from waltz.client import lock_holds, mount_procedure
from waltz.client.client_partition import ClientPartition
from waltz.client.context import AppendPayload
from waltz.client.mount_procedure import PartitionState
from waltz.client.submission import Submission
from waltz.errors import ClientAheadOfLogError
from waltz.protocol import client_pb2
from waltz.protocol.records import ReqId

CLIENT = 7
OTHER = 8


class Callbacks(WaltzClientCallbacks):
    def __init__(self, mark: int) -> None:
        self.mark = mark
        self.applied: list[int] = []
        self.gate: threading.Event | None = None  # set: applies wait for it (at most 10 s)
        self.reported: list[BaseException] | None = None  # a list: uncaught exceptions expected

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.mark

    def apply_transaction(self, transaction: Transaction) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.applied.append(transaction.transaction_id)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        if self.reported is None:
            raise AssertionError(f"unexpected {exception!r}")
        self.reported.append(exception)


class FakeConnection:
    """Records what the partition sends; ``closed`` is set by the test."""

    def __init__(self, endpoint: str, seq_num: int) -> None:
        self.endpoint = endpoint
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

    def mounts(self) -> list[client_pb2.MountRequest]:
        return [m.mount for m in self.sent if isinstance(m, client_pb2.ClientMessage) and m.HasField("mount")]

    def appends(self) -> list[ReqId]:
        return [m[0] for m in self.sent if isinstance(m, tuple)]


class FakeHost:
    def __init__(self, callbacks: Callbacks) -> None:
        self.client_id = CLIENT
        self.callbacks = callbacks
        self.data_source: Any = None
        self.seq = 0
        self.network_seq = 0
        self.connections: list[FakeConnection] = []
        self.completed_ids: list[tuple[bytes, int]] = []
        self.retried: list[tuple[bytes, int | None]] = []
        self.first_attempts: list[tuple[bytes, int]] = []
        self.rejections: list[tuple[bytes, BaseException]] | None = None  # a list: rejections expected

    def next_seq_num(self) -> int:
        self.seq += 1
        return self.seq

    async def connection(self, endpoint: str) -> Any:
        if not self.connections or self.connections[-1].closed:
            self.network_seq += 1
            self.connections.append(FakeConnection(endpoint, self.network_seq))
        return self.connections[-1]

    def completed(self, committed: list[tuple[Submission, int]]) -> None:
        for submission, transaction_id in committed:
            self.completed_ids.append((submission.context.data, transaction_id))  # type: ignore[attr-defined]

    def retry(self, submission: Submission, lock_target: int | None) -> None:
        self.retried.append((submission.context.data, lock_target))  # type: ignore[attr-defined]

    def queued_attempt(self, submission: Submission, target: int) -> None:
        self.first_attempts.append((submission.context.data, target))  # type: ignore[attr-defined]

    def rejected(self, submission: Submission, error: BaseException) -> None:
        if self.rejections is None:
            raise AssertionError(f"rejected {error!r}")
        self.rejections.append((submission.context.data, error))  # type: ignore[attr-defined]

    def expired_unsent(self, submission: Submission) -> None:
        raise AssertionError("expired while waiting for the mount")

    def refresh_assignment(self) -> None:
        pass

    async def previous_apply_ended(self, partition_id: int) -> None:
        pass


class Data(TransactionContext):
    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(self.data)
        return True


def feed(req_id: ReqId, transaction_id: int) -> client_pb2.FeedEntries:
    """A run of one feed entry."""
    return feed_run(transaction_id, [req_id], partition_id=req_id.partition_id)


def other(seq: int) -> ReqId:
    return ReqId(OTHER, 3, 0, seq)


def run(
    scenario: Callable[[ClientPartition, FakeHost, Callbacks], Awaitable[None]],
    mark: int = 5,
    *,
    hold_conflicting_appends: bool = True,
    retry_linger: float = 0.0,
    max_apply_backlog: int = 0,
) -> None:
    async def main() -> None:
        callbacks = Callbacks(mark)
        host = FakeHost(callbacks)
        partition = ClientPartition(
            0,
            host,  # type: ignore[arg-type]
            host,
            max_apply_batch=10,
            hold_conflicting_appends=hold_conflicting_appends,
            retry_linger=retry_linger,
            max_apply_backlog=max_apply_backlog,
        )
        try:
            await scenario(partition, host, callbacks)
        finally:
            worker, _ = partition.close()
            if worker is not None:
                await asyncio.to_thread(worker.close)

    asyncio.run(main())


async def mount(
    partition: ClientPartition, host: FakeHost, *, entries: list[client_pb2.FeedEntries] = ()
) -> FakeConnection:  # type: ignore[assignment]
    """Drive one mount: wait for the request, stream ``entries``, answer ready."""

    def total() -> int:
        return sum(len(c.mounts()) for c in host.connections)

    count = total()
    await settle(lambda: total() > count, "a mount request")
    connection = host.connections[-1]
    request = connection.mounts()[-1]
    for entry in entries:
        deliver(partition, connection, entry)
    response = client_pb2.MountResponse(req_id=request.req_id, partition_ready=True)
    partition.on_message(connection, "mount", response)  # type: ignore[arg-type]
    await settle(lambda: partition.state is PartitionState.MOUNTED, "the partition to mount")
    return connection


async def mounted(partition: ClientPartition, host: FakeHost) -> FakeConnection:
    """Mount the partition on ``server-a:1``, generation 3, with an empty feed."""
    partition.mount()
    partition.set_placement("server-a:1", 3)
    return await mount(partition, host)


def submission(data: bytes) -> tuple[Submission, AppendPayload]:
    sub = Submission(Data(data), 0, lambda pid: 5, 1 << 20)
    payload = sub.attempt()
    assert payload is not None
    return sub, payload


async def mounted_with_appends(partition: ClientPartition, host: FakeHost, *datas: bytes) -> FakeConnection:
    """:func:`mounted`, then an append of each of ``datas``."""
    connection = await mounted(partition, host)
    for data in datas:
        partition.send_append(*submission(data))
    return connection


def deliver(partition: ClientPartition, connection: object, entry: object) -> None:
    """One run of feed entries in a batch of its own, as the client's message handler delivers it."""
    partition.on_feed_entries(connection, entry)  # type: ignore[arg-type]
    partition.end_of_batch()


def test_appends_wait_for_the_mount_and_carry_the_generation() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        partition.mount()
        partition.send_append(*submission(b"early"))  # blocked: not mounted yet
        partition.set_placement("server-a:1", 3)
        connection = await mount(partition, host, entries=[feed(other(1), 6)])
        request = connection.mounts()[0]
        assert request.client_high_water_mark == 5  # the callbacks' mark on a first mount
        assert request.seq_num == connection.seq_num == 1
        assert request.req_id.generation == 3
        [append] = connection.appends()  # sent once mounted, under generation 3
        assert (append.client_id, append.generation, append.partition_id) == (CLIENT, 3, 0)
        await settle(lambda: callbacks.applied == [6], "transaction 6 to be applied")

    run(scenario)


def test_a_first_mount_s_feed_window_is_a_full_window_beyond_the_callbacks_mark() -> None:
    """docs/protocol.md "Feed window": the first mount's window starts at the callbacks' mark,
    which the apply worker takes as its floor a moment after the mount request is made; then a
    grant follows each half window applied."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        callbacks.gate = threading.Event()
        partition.mount()
        partition.set_placement("server-a:1", 3)
        connection = await mount(partition, host)
        request = connection.mounts()[0]
        assert request.client_high_water_mark == 11
        assert request.feed_window == 40, "the window counted from the mark before the floor"
        deliver(partition, connection, run_of(12, *(other(i) for i in range(1, 41))))
        assert partition.worker is not None
        assert partition.worker.backlog == 40
        callbacks.gate.set()
        await settle(lambda: callbacks.applied == list(range(12, 52)), "the window to be applied")
        grants = [
            m.feed_window.window_end
            for m in connection.sent
            if isinstance(m, client_pb2.ClientMessage) and m.HasField("feed_window")
        ]
        # A grant each time half a window more is applied (read when the loop gets to it): the
        # window never falls more than half a window behind what was applied.
        assert grants and grants == sorted(set(grants)) and grants[0] >= 11 + 20 + 40, grants
        assert 51 + 20 <= grants[-1] <= 51 + 40, grants

    run(scenario, mark=11, max_apply_backlog=40)


def test_the_feed_confirms_own_appends_and_fails_older_ones() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted_with_appends(partition, host, b"a", b"b", b"c")
        _a, b, c = connection.appends()
        deliver(partition, connection, feed(b, 6))
        assert host.completed_ids == [(b"b", 6)]
        assert host.retried == [(b"a", None)]  # older than a success: failed, re-executed
        deliver(partition, connection, feed(other(9), 8))  # a gap: ignored
        deliver(partition, connection, feed(other(9), 7))
        lock = client_pb2.LockFailure(req_id=c.to_proto(), transaction_id=7)
        partition.on_message(connection, "lock_failure", lock)  # type: ignore[arg-type]
        assert host.retried[-1] == (b"c", 7)  # retried once transaction 7 is applied
        await settle(lambda: callbacks.applied == [6, 7], "transactions 6 and 7 to be applied")
        assert partition.own_committed_mark == 6

    run(scenario)


def test_a_flush_fails_what_was_sent_before_it_once_the_feed_caught_up() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        partition.mount()
        partition.set_placement("server-a:1", 3)
        connection = await mount(partition, host)
        partition.send_append(*submission(b"lost"))
        partition.send_flush()
        partition.send_append(*submission(b"after the flush"))
        flush = next(
            m.flush
            for m in connection.sent
            if isinstance(m, client_pb2.ClientMessage) and m.HasField("flush")
        )
        # The server says: everything before the flush is resolved; the high-water mark is 7.
        response = client_pb2.FlushResponse(req_id=flush.req_id, transaction_id=7)
        partition.on_message(connection, "flush", response)  # type: ignore[arg-type]
        assert host.retried == []  # the feed (at 5) may still carry a commit of it
        deliver(partition, connection, feed(other(1), 6))
        assert host.retried == []
        deliver(partition, connection, feed(other(2), 7))
        assert host.retried == [(b"lost", None)]  # not in the feed up to 7: it failed
        assert len(partition.monitor) == 1  # the one sent after the flush is still pending

    run(scenario)


def test_reconnect_mounts_from_the_lower_mark_and_fails_pending_appends_at_the_response() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        partition.mount()
        partition.set_placement("server-a:1", 3)
        first = await mount(partition, host, entries=[feed(other(1), 6), feed(other(2), 7)])
        partition.send_append(*submission(b"committed"))
        partition.send_append(*submission(b"lost"))
        committed, _lost = first.appends()
        # Another instance sharing the database applied up to 20 (this client has seen up to 7).
        callbacks.mark = 20
        first.closed = True
        partition.connection_lost(first)  # type: ignore[arg-type]
        assert partition.state is PartitionState.MOUNTING
        partition.send_append(*submission(b"while mounting"))  # blocked until the mount completes
        second = await mount(partition, host, entries=[feed(committed, 8), feed(other(3), 9)])
        request = second.mounts()[-1]
        assert request.client_high_water_mark == 7  # the lower mark: learn the pending appends' fate
        assert request.seq_num == 2  # a new network client
        assert host.completed_ids == [(b"committed", 8)]
        assert host.retried == [(b"lost", None)]  # still pending at the mount response: failed
        assert len(second.appends()) == 1  # the blocked one, sent after the mount
        assert not first.appends()[2:]

    run(scenario)


def test_a_flush_answered_below_the_mount_mark_fails_no_pending_append() -> None:
    """docs/design/client.md "Failed-append detection": a flush whose mark is below the mark the
    partition was mounted from (a server that took a database ahead of its log) fails nothing,
    where the pending append ran again, and committed again, at every flush."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        assert connection.mounts()[0].client_high_water_mark == 10**9
        partition.send_append(*submission(b"pending"))
        partition.send_flush()
        flush = next(
            m.flush
            for m in connection.sent
            if isinstance(m, client_pb2.ClientMessage) and m.HasField("flush")
        )
        response = client_pb2.FlushResponse(req_id=flush.req_id, transaction_id=13)
        partition.on_message(connection, "flush", response)  # type: ignore[arg-type]
        assert host.retried == []
        assert len(partition.monitor) == 1

    run(scenario, mark=10**9)


def ahead_of_log(request: client_pb2.MountRequest, high_water_mark: int) -> client_pb2.ServerError:
    """The server's refusal of ``request``: its mark is above ``high_water_mark``."""
    return client_pb2.ServerError(
        req_id=request.req_id,
        message=f"client high-water mark {request.client_high_water_mark} is above partition 0's "
        f"high-water mark {high_water_mark}",
        code=client_pb2.CLIENT_AHEAD_OF_LOG,
        client_high_water_mark=request.client_high_water_mark,
        high_water_mark=high_water_mark,
    )


def test_a_mount_refused_as_ahead_of_the_log_ends_the_appends_with_the_refusal_until_a_mount_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/design/client.md "Mount and the client high-water mark": the refusal is reported once,
    the partition stays unmounted, the appends pending, blocked and sent meanwhile end with it
    (none runs again), and it passes when a later mount succeeds."""
    monkeypatch.setattr(mount_procedure, "REFUSED_MOUNT_PAUSE", 0.05)

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        callbacks.reported, host.rejections = [], []
        first = await mounted(partition, host)
        partition.send_append(*submission(b"pending"))  # sent: its fate is the next mount's
        first.closed = True
        partition.connection_lost(first)  # type: ignore[arg-type]
        partition.send_append(*submission(b"blocked"))
        await settle(lambda: len(host.connections) == 2 and host.connections[1].mounts(), "the remount")
        second = host.connections[1]
        partition.on_message(second, "error", ahead_of_log(second.mounts()[-1], 3))  # type: ignore[arg-type]
        assert partition.state is PartitionState.MOUNTING
        [reported] = callbacks.reported
        assert isinstance(reported, ClientAheadOfLogError) and partition.refusal is reported
        assert (reported.client_high_water_mark, reported.high_water_mark) == (5, 3)
        assert "above partition 0's high-water mark 3" in str(reported)
        assert [data for data, _ in host.rejections] == [b"pending", b"blocked"]
        assert all(error is reported for _, error in host.rejections)
        partition.send_append(*submission(b"while refused"))
        assert host.rejections[-1] == (b"while refused", reported)
        assert host.retried == [] and len(partition.monitor) == 0
        # Asked again after the pause: refused again (not reported again), then mounted.
        await settle(lambda: len(second.mounts()) == 2, "a second mount request")
        partition.on_message(second, "error", ahead_of_log(second.mounts()[-1], 3))  # type: ignore[arg-type]
        assert len(callbacks.reported) == 1
        await mount(partition, host)
        assert partition.refusal is None
        partition.send_append(*submission(b"mounted"))
        assert len(second.appends()) == 1 and len(host.rejections) == 3

    run(scenario)


def run_of(first: int, *req_ids: ReqId) -> client_pb2.FeedEntries:
    """A run of feed entries: transactions ``first``, ``first + 1``, ... appended as ``req_ids``."""
    return feed_run(first, req_ids, [r.seq_num * 10 for r in req_ids])


def test_a_run_of_feed_entries_is_each_entry_in_turn() -> None:
    """docs/protocol.md "Feed entries": own appends in a run succeed (older pending ones fail),
    entries already had are skipped, a run past the next transaction is a gap that mounts again
    from what was seen, and every entry is applied once, in order, with its ReqId and header."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted_with_appends(partition, host, b"a", b"b", b"c")
        _a, b, c = connection.appends()
        deliver(partition, connection, run_of(6, other(1), b, other(2)))
        assert host.completed_ids == [(b"b", 7)]
        assert host.retried == [(b"a", None)]
        deliver(partition, connection, run_of(7, b, other(2), c, other(3)))  # 7 and 8 again: skipped
        assert host.completed_ids == [(b"b", 7), (b"c", 9)]
        deliver(partition, connection, run_of(12, other(4)))  # past 11: a gap
        assert partition.feed_gaps == 1
        assert partition.metrics.feed_gaps._value.get() == 1
        assert partition.state is PartitionState.MOUNTING  # never stalls behind the gap
        remounted = await mount(partition, host, entries=[run_of(11, other(5), other(6))])
        assert remounted.mounts()[-1].client_high_water_mark == 10  # the feed restarts after 10
        await settle(lambda: callbacks.applied == [6, 7, 8, 9, 10, 11, 12], "transactions 6 to 12")
        assert partition.own_committed_mark == 9
        assert partition.server_high_water_mark == 12
        assert not partition.monitor

    run(scenario)


def test_commits_of_a_run_are_handed_over_even_when_a_later_entry_of_it_fails() -> None:
    """The commits seen in a run of feed entries go to the host once at the end of the run, also
    when handling a later entry raised (here: re-executing a failed append)."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted_with_appends(partition, host, b"a", b"b", b"c")
        a, _b, c = connection.appends()

        def broken_retry(*args: object) -> None:
            raise RuntimeError("retry failed")

        host.retry = broken_retry  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="retry failed"):
            # a commits as 6; c as 7 fails b, whose re-execution raises
            deliver(partition, connection, run_of(6, a, c))
        assert host.completed_ids == [(b"a", 6)]

    run(scenario)


def test_a_run_with_columns_of_different_lengths_is_dropped_and_the_partition_mounts_again() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        partition.mount()
        partition.set_placement("server-a:1", 3)
        connection = await mount(partition, host)
        broken = run_of(6, other(1), other(2))
        del broken.headers[1]
        deliver(partition, connection, broken)
        assert partition.state is PartitionState.MOUNTING
        await settle(lambda: len(connection.mounts()) == 2, "a second mount request")
        assert not callbacks.applied
        empty = client_pb2.FeedEntries(partition_id=0, first_transaction_id=6)
        deliver(partition, connection, empty)
        await settle(lambda: len(connection.mounts()) == 3, "a third mount request")
        deliver(partition, connection, run_of(6, other(1), other(2)))  # the feed again, well formed
        request = connection.mounts()[-1]
        ready = client_pb2.MountResponse(req_id=request.req_id, partition_ready=True)
        partition.on_message(connection, "mount", ready)  # type: ignore[arg-type]
        await settle(lambda: partition.state is PartitionState.MOUNTED, "the partition to mount")
        await settle(lambda: callbacks.applied == [6, 7], "transactions 6 and 7")

    run(scenario)


class Locked(TransactionContext):
    """A context with locks per mode (names of ``PartitionLocalLock("k", n)`` by number)."""

    def __init__(
        self,
        data: bytes,
        write: tuple[int, ...] = (),
        read: tuple[int, ...] = (),
        append: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.data = data
        self.modes = (write, read, append)

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(self.data)
        write, read, append = self.modes
        builder.set_write_locks(PartitionLocalLock("k", n) for n in write)
        builder.set_read_locks(PartitionLocalLock("k", n) for n in read)
        builder.set_append_locks(PartitionLocalLock("k", n) for n in append)
        return True


def locked(data: bytes, mark: int = 5, **modes: tuple[int, ...]) -> tuple[Submission, AppendPayload]:
    sub = Submission(Locked(data, **modes), 0, lambda pid: mark, 1 << 20)
    payload = sub.attempt()
    assert payload is not None
    return sub, payload


def sent_data(connection: FakeConnection) -> list[bytes]:
    return [m[1].data for m in connection.sent if isinstance(m, tuple)]


def held(partition: ClientPartition) -> float:
    return partition.metrics.held_appends._value.get()  # type: ignore[attr-defined]


def test_an_append_behind_an_own_pending_write_lock_is_held_and_fails_when_that_one_commits() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        partition.send_append(*locked(b"holder", write=(1,)))
        partition.send_append(*locked(b"writes it too", write=(1,)))
        partition.send_append(*locked(b"reads it", read=(1,)))
        partition.send_append(*locked(b"another lock", write=(2,)))
        partition.send_append(*locked(b"reads only, is no holder", read=(3,)))
        partition.send_append(*locked(b"behind a read", write=(3,)))
        sent = [b"holder", b"another lock", b"reads only, is no holder", b"behind a read"]
        assert sent_data(connection) == sent
        assert held(partition) == 2
        holder = connection.appends()[0]
        deliver(partition, connection, feed(holder, 6))
        assert host.completed_ids == [(b"holder", 6)]
        # Both would fail the server's check (mark 5 < 6): lock failures on 6, found without a
        # round trip. The first runs again; the other waits for its turn behind that attempt.
        assert host.retried == [(b"writes it too", 6)]
        assert len(sent_data(connection)) == 4
        assert len(partition.monitor) == 3

    run(scenario)


def test_a_held_append_is_sent_when_its_holder_fails_or_its_mark_covers_the_commit() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        partition.send_append(*locked(b"refused holder", write=(1,)))
        partition.send_append(*locked(b"behind the refused", write=(1,)))
        partition.send_append(*locked(b"appends to 2", append=(2,)))
        partition.send_append(*locked(b"mark 7, behind 2", mark=7, read=(2,)))
        partition.send_append(*locked(b"mark 5, behind 2", read=(2,)))
        assert sent_data(connection) == [b"refused holder", b"appends to 2"]
        refused, appends = connection.appends()
        lock = client_pb2.LockFailure(req_id=refused.to_proto(), transaction_id=6)
        partition.on_message(connection, "lock_failure", lock)  # type: ignore[arg-type]
        assert host.retried == [(b"refused holder", 6)]
        # What it held waits behind its next attempt: 6 most likely wrote the lock they share.
        assert sent_data(connection)[2:] == []
        deliver(partition, connection, feed(other(1), 6))
        deliver(partition, connection, feed(appends, 7))
        # Its mark (7, read from a database another instance applied 7 to, say) covers the
        # holder's commit: the server's check passes it, so it is sent as it is; the other fails.
        assert sent_data(connection)[2:] == [b"mark 7, behind 2"]
        assert host.retried[1:] == [(b"mark 5, behind 2", 7)]
        assert held(partition) == 3

    run(scenario)


def test_what_a_pending_append_holds_back_is_sent_after_a_remount_and_returned_by_close() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        first = await mounted(partition, host)
        partition.send_append(*locked(b"holder", write=(1,)))
        partition.send_append(*locked(b"held", write=(1,)))
        first.closed = True
        partition.connection_lost(first)  # type: ignore[arg-type]
        second = await mount(partition, host)
        # The holder was pending at the mount response: it failed (re-executed), and what it held
        # went out on the new connection, now holding the lock itself.
        assert host.retried == [(b"holder", None)]
        assert sent_data(second) == [b"held"]
        partition.send_append(*locked(b"held again", write=(1,)))
        assert sent_data(second) == [b"held"]
        worker, submissions = partition.close()
        assert sorted(s.context.data for s in submissions) == [b"held", b"held again"]  # type: ignore[attr-defined]
        if worker is not None:
            await asyncio.to_thread(worker.close)

    run(scenario)


def test_appends_are_not_held_when_hold_conflicting_appends_is_off() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        partition.send_append(*locked(b"first", write=(1,)))
        partition.send_append(*locked(b"second", write=(1,)))
        assert sent_data(connection) == [b"first", b"second"]
        assert held(partition) == 0
        callbacks.gate = threading.Event()
        deliver(partition, connection, feed(connection.appends()[0], 6))
        partition.send_append(*locked(b"late", write=(1,)))  # nothing remembered: the server decides
        assert sent_data(connection)[-1] == b"late"
        assert host.retried == []
        callbacks.gate.set()

    run(scenario, hold_conflicting_appends=False)


def test_a_re_attempt_s_append_is_sent_with_the_retry_linger_a_first_attempt_s_without() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        first, first_payload = locked(b"first", write=(1,))
        partition.send_append(first, first_payload)
        again, _ = locked(b"again", write=(2,))
        payload = again.attempt()  # its second attempt (after a lock failure, say)
        assert payload is not None and again.attempts == 2
        partition.send_append(again, payload)
        assert [(m[1].data, m[2]) for m in connection.sent if isinstance(m, tuple)] == [
            (b"first", 0.0),
            (b"again", 0.003),
        ]

    run(scenario, retry_linger=0.003)


def test_contexts_waiting_for_a_hot_lock_run_again_one_per_commit_in_their_order() -> None:
    """A commit of the lock re-executes the next waiting context only, not every one of them."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        mark = {"value": 5}
        subs = {
            name: Submission(Locked(name, write=(1,)), 0, lambda pid: mark["value"], 1 << 20)
            for name in (b"holder", b"a", b"b", b"c")
        }
        for sub in subs.values():
            payload = sub.attempt()
            assert payload is not None
            partition.send_append(sub, payload)
        assert sent_data(connection) == [b"holder"]
        deliver(partition, connection, feed(connection.appends()[0], 6))
        assert host.retried == [(b"a", 6)]  # b and c wait behind a's next attempt

        mark["value"] = 6  # a runs again once 6 is applied (the client's retry does that)
        again = subs[b"a"].attempt()
        assert again is not None
        partition.send_append(subs[b"a"], again)
        assert sent_data(connection) == [b"holder", b"a"]
        deliver(partition, connection, feed(connection.appends()[1], 7))
        assert host.retried == [(b"a", 6), (b"b", 7)]  # one re-execution per commit

        partition.leader_ended(subs[b"b"])  # b ended without an append (it expired, say)
        assert host.retried == [(b"a", 6), (b"b", 7), (b"c", 7)]
        assert partition.close()[1] == []

    run(scenario)


def test_contexts_waiting_behind_a_context_that_runs_again_are_returned_by_close() -> None:
    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        for name in (b"holder", b"a", b"b", b"c"):
            partition.send_append(*locked(name, write=(1,)))
        refused = connection.appends()[0]
        lock = client_pb2.LockFailure(req_id=refused.to_proto(), transaction_id=6)
        partition.on_message(connection, "lock_failure", lock)  # type: ignore[arg-type]
        assert host.retried == [(b"holder", 6)]  # a, b, c wait behind its next attempt
        assert sent_data(connection) == [b"holder"]
        worker, submissions = partition.close()
        assert sorted(s.context.data for s in submissions) == [b"a", b"b", b"c"]  # type: ignore[attr-defined]
        if worker is not None:
            await asyncio.to_thread(worker.close)

    run(scenario)


def test_a_context_whose_expected_lock_an_own_append_holds_is_queued_before_its_first_attempt() -> None:
    """TransactionContext.expected_locks: a context queued behind the holder runs its first attempt
    once the holder commits (after the holder's transaction, not as a lock failure), in its turn
    among the contexts held back behind the same lock; once the holder failed, at once."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        partition.send_append(*locked(b"holder", write=(1,)))
        held_back, payload = locked(b"held", write=(1,))
        partition.send_append(held_back, payload)
        hashes = [PartitionLocalLock("k", 1).lock_hash]
        assert partition.holds_any(hashes)
        assert not partition.holds_any([PartitionLocalLock("k", 2).lock_hash])
        queued = Submission(Locked(b"queued", write=(1,)), 0, lambda pid: 5, 1 << 20)
        partition.queue_first_attempt(queued, hashes)
        assert queued.attempts == 0  # nothing executed
        assert sent_data(connection) == [b"holder"]
        assert held(partition) == 2
        deliver(partition, connection, feed(connection.appends()[0], 6))
        assert host.retried == [(b"held", 6)]  # its turn comes after "held"'s next attempt
        assert host.first_attempts == []
        partition.leader_ended(held_back)  # "held" ended without an append (dropped, say)
        assert host.first_attempts == [(b"queued", 6)]  # runs once 6 is applied

        # Nobody holds the lock any more: the first attempt runs at once.
        free = Submission(Locked(b"free", write=(2,)), 0, lambda pid: 5, 1 << 20)
        partition.queue_first_attempt(free, [PartitionLocalLock("k", 2).lock_hash])
        assert host.first_attempts[-1] == (b"free", -1)

        # A holder lost with its connection: what was queued behind it runs at once.
        partition.send_append(*locked(b"second holder", write=(3,)))
        lost = Submission(Locked(b"behind a lost one", write=(3,)), 0, lambda pid: 5, 1 << 20)
        partition.queue_first_attempt(lost, [PartitionLocalLock("k", 3).lock_hash])
        connection.closed = True
        partition.connection_lost(connection)  # type: ignore[arg-type]
        await mount(partition, host)
        assert host.first_attempts[-1] == (b"behind a lost one", -1)

    run(scenario)


def test_a_context_claiming_a_lock_an_own_append_writes_waits_for_the_claimant_s_append() -> None:
    """docs/design/locks.md "Locks of appends in flight": a first attempt claims its expected locks
    until its append reaches the loop; another context expecting one of them that an own append
    writes waits without running and is queued behind that append once it is there. Locks no own
    append writes are claimed side by side; a claimant that ends without an append lets the next
    one go; close returns the contexts still waiting."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        lock1, lock2 = (PartitionLocalLock("k", n).lock_hash for n in (1, 2))
        readers = [Submission(Locked(name, read=(2,)), 0, lambda pid: 5, 1 << 20) for name in (b"r1", b"r2")]
        assert all(partition.claim(reader, [lock2]) for reader in readers)  # nobody here writes 2

        partition.send_append(*locked(b"holder", write=(1,)))  # an own append writes 1 now
        first, first_payload = locked(b"first", write=(1,))
        assert partition.claim(first, [lock1])
        second, third, fourth = (
            Submission(Locked(name, write=(1,)), 0, lambda pid: 5, 1 << 20)
            for name in (b"second", b"third", b"fourth")
        )
        assert not any(partition.claim(s, [lock1]) for s in (second, third, fourth))
        assert second.attempts == third.attempts == fourth.attempts == 0

        partition.send_append(first, first_payload)  # held back behind "holder"
        partition.claims_released(partition.release_claims(first))
        # "second" claimed in turn and is queued behind "holder"; the others wait for "second",
        # in order.
        assert partition.has_claims(second) and not partition.has_claims(third)
        assert list(partition.release_claims(second)) == [(third, [lock1]), (fourth, [lock1])]
        assert second.attempts == third.attempts == fourth.attempts == 0
        deliver(partition, connection, feed(connection.appends()[0], 6))
        assert host.retried == [(b"first", 6)]  # "second" waits behind first's next attempt

        ends = Submission(Locked(b"ends", write=(1,)), 0, lambda pid: 5, 1 << 20)
        waits = Submission(Locked(b"waits", write=(1,)), 0, lambda pid: 5, 1 << 20)
        assert partition.claim(ends, [lock1]) and not partition.claim(waits, [lock1])
        partition.claims_released(partition.release_claims(ends))  # it ended without an append
        assert partition.has_claims(waits)

        late = Submission(Locked(b"late", write=(1,)), 0, lambda pid: 5, 1 << 20)
        assert not partition.claim(late, [lock1])
        # second, third, fourth, waits, late: each met a claim once
        assert partition.metrics.claim_waits._value.get() == 5  # type: ignore[attr-defined]
        worker, submissions = partition.close()
        assert b"late" in [s.context.data for s in submissions]  # type: ignore[attr-defined]
        if worker is not None:
            await asyncio.to_thread(worker.close)

    run(scenario)


def test_an_attempt_that_did_not_see_an_own_commit_on_its_lock_fails_without_the_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Until this client has applied its own commit, an append built from a mark below it that
    takes one of the commit's WRITE or APPEND locks (for writing or reading) would fail the
    server's lock check: it runs again once that commit is applied, unsent, with what waited
    behind it. Attempts that saw the commit, or take other locks, are sent. Once applied, the
    commit is still remembered among the latest ones (an attempt that read from below it before
    the apply is sent after it), then forgotten (``KEEP_APPLIED_COMMITS``)."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        callbacks.gate = threading.Event()  # the commit below stays unapplied until set
        try:
            await commit_then_append(partition, host, callbacks, callbacks.gate)
        finally:
            callbacks.gate.set()

    async def commit_then_append(
        partition: ClientPartition, host: FakeHost, callbacks: Callbacks, gate: threading.Event
    ) -> None:
        connection = await mounted(partition, host)
        partition.send_append(*locked(b"holder", write=(1,), append=(4,)))
        deliver(partition, connection, feed(connection.appends()[0], 6))
        assert host.completed_ids == [(b"holder", 6)]
        for name, modes in ((b"writes it", {"write": (1,)}), (b"reads it", {"read": (1,)})):
            partition.send_append(*locked(name, **modes))
        partition.send_append(*locked(b"reads the append lock", read=(4,)))
        assert sent_data(connection) == [b"holder"]
        assert host.retried == [(b"writes it", 6), (b"reads it", 6), (b"reads the append lock", 6)]

        # A context that ran again after a lock failure, with contexts following it: they keep
        # following its next attempt, which waits for the commit.
        leader, leader_payload = locked(b"leader", write=(1,))
        follower = Submission(Locked(b"follower", write=(1,)), 0, lambda pid: 5, 1 << 20)
        leader.followers = [(follower, None, 3)]
        partition.send_append(leader, leader_payload)
        assert host.retried[-1] == (b"leader", 6)
        assert leader.followers == [(follower, None, 6)]
        partition.leader_ended(leader)
        assert host.first_attempts == [(b"follower", 6)]

        partition.send_append(*locked(b"saw it", mark=6, write=(1,)))
        partition.send_append(*locked(b"another lock", write=(2,)))
        assert sent_data(connection) == [b"holder", b"saw it", b"another lock"]

        # Applied: an attempt from an older mark still fails here (no append pending holds 4),
        # one that saw the commit is sent.
        gate.set()
        await settle(lambda: partition.applied.value >= 6, "transaction 6 to be applied")
        partition.send_append(*locked(b"read below it", read=(4,)))
        assert host.retried[-1] == (b"read below it", 6)
        partition.send_append(*locked(b"read after the apply", mark=6, read=(4,)))
        assert sent_data(connection)[-1] == b"read after the apply"
        assert partition.committed_after([PartitionLocalLock("k", n).lock_hash for n in (1, 4)], 5) == 6

        # Beyond the latest KEEP_APPLIED_COMMITS own commits an applied one is forgotten: an
        # attempt from an older mark is the server's to refuse.
        monkeypatch.setattr(lock_holds, "KEEP_APPLIED_COMMITS", 0)
        partition.send_append(*locked(b"once forgotten", read=(4,)))
        assert sent_data(connection)[-1] == b"once forgotten"
        assert partition.committed_after([PartitionLocalLock("k", n).lock_hash for n in (1, 4)], 5) == 5

    run(scenario)


def test_a_context_expecting_a_lock_of_an_unapplied_own_commit_runs_its_first_attempt_after_it() -> None:
    """TransactionContext.expected_locks: with no append pending on the lock but an own commit on
    it not applied yet, the first attempt waits for that commit (it would fail the lock check
    otherwise); ``holds_any`` hints at it for an attempt that would read below the commit."""

    async def scenario(partition: ClientPartition, host: FakeHost, callbacks: Callbacks) -> None:
        connection = await mounted(partition, host)
        gate = callbacks.gate = threading.Event()
        try:
            queue_after_a_commit(partition, host, connection)
        finally:
            gate.set()

    def queue_after_a_commit(partition: ClientPartition, host: FakeHost, connection: FakeConnection) -> None:
        partition.send_append(*locked(b"holder", write=(1,)))
        deliver(partition, connection, feed(connection.appends()[0], 6))
        hashes = [PartitionLocalLock("k", 1).lock_hash]
        assert partition.holds_any(hashes, 5)
        assert not partition.holds_any(hashes, 6)
        assert not partition.holds_any([PartitionLocalLock("k", 2).lock_hash], 5)
        queued = Submission(Locked(b"queued", write=(1,)), 0, lambda pid: 5, 1 << 20)
        partition.queue_first_attempt(queued, hashes)
        free = Submission(Locked(b"free", write=(2,)), 0, lambda pid: 5, 1 << 20)
        partition.queue_first_attempt(free, [PartitionLocalLock("k", 2).lock_hash])
        assert host.first_attempts == [(b"queued", 6), (b"free", -1)]
        assert queued.attempts == 0

    run(scenario)
