"""The apply worker: ordered, never twice, retried with backoff, batched on request."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from waltz import Transaction, WaltzClientCallbacks
from waltz.client.apply_worker import ApplyWorker
from waltz.client.genesis_hold import GenesisHold
from waltz.client.routing import SplitOrigin
from waltz.client.waiting import Watermark
from waltz.errors import GenesisHeldError
from waltz.local.processes import wait_until
from waltz.protocol.records import ReqId


class Callbacks(WaltzClientCallbacks):
    def __init__(self, fail_times: int = 0) -> None:
        self.applied: list[int] = []
        self.threads: set[str] = set()
        self.errors: list[tuple[int, int, str]] = []
        self.fail_times = fail_times

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.applied[-1] if self.applied else -1

    def apply_transaction(self, transaction: Transaction) -> None:
        self.threads.add(threading.current_thread().name)
        if transaction.transaction_id == 3 and self.fail_times > 0:
            self.fail_times -= 1
            raise RuntimeError("database down")
        self.applied.append(transaction.transaction_id)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append((partition_id, transaction_id, str(exception)))


class BatchCallbacks(Callbacks):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        self.batches.append([t.transaction_id for t in transactions])
        self.applied.extend(t.transaction_id for t in transactions)


def txn(tid: int) -> Transaction:
    return Transaction(4, tid, ReqId(1, 0, 4, tid + 100), 0, None, b"")


def run(
    callbacks: Callbacks, ids: list[int], floors: dict[int, int] | None = None, **kwargs: float
) -> Watermark:
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, initial_backoff=0.01, **kwargs)  # type: ignore[arg-type]
    worker.start()
    try:
        for tid in ids:
            if floors and tid in floors:
                worker.set_floor(floors[tid])
            worker.enqueue(txn(tid))
        assert mark.wait(ids[-1], 10), f"applied only up to {mark.value}: {callbacks.applied}"
    finally:
        worker.close()
    return mark


def test_applies_in_order_on_one_thread_of_its_own() -> None:
    callbacks = Callbacks()
    run(callbacks, list(range(20)))
    assert callbacks.applied == list(range(20))
    assert callbacks.threads == {"waltz-apply-4"}


def test_a_failing_apply_is_reported_and_retried_never_skipped() -> None:
    callbacks = Callbacks(fail_times=3)
    run(callbacks, list(range(6)))
    assert callbacks.applied == list(range(6))
    assert callbacks.errors == [(4, 3, "database down")] * 3


def test_a_floor_counts_transactions_as_applied_elsewhere() -> None:
    callbacks = Callbacks()
    # 0, 1 queued; then the client learns that the database is at 4 (another instance applied up
    # to it): 2..4 are not applied again by this client, 5.. are.
    run(callbacks, [0, 1, 2, 3, 4, 5, 6], floors={2: 4})
    assert callbacks.applied == [0, 1, 5, 6]


def test_the_backlog_counts_transactions_not_floors() -> None:
    """A mount queues the callbacks' mark as a floor before the transactions of its feed; until the
    worker takes it, the backlog (what ``client.maxApplyBacklog`` bounds) is the transactions."""
    mark = Watermark(-1)
    worker = ApplyWorker(4, Callbacks(), mark)  # not started: nothing is taken
    worker.set_floor(11)
    worker.enqueue_many([(txn(tid), None) for tid in range(12, 17)])
    worker.set_floor(13)
    assert worker.backlog == 5
    assert worker.applied_mark == 11
    worker.start()
    try:
        assert mark.wait(16, 10), f"applied only up to {mark.value}"
        assert worker.backlog == 0
    finally:
        worker.close()


def test_batches_when_the_callbacks_implement_the_hook() -> None:
    callbacks = BatchCallbacks()
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, max_batch=4)
    gate = threading.Event()
    original = callbacks.apply_transaction

    # Hold the first transaction so that the others queue up behind it.
    def slow_first(transaction: Transaction) -> None:
        gate.wait(10)
        original(transaction)

    callbacks.apply_transaction = slow_first  # type: ignore[method-assign]
    worker.start()
    try:
        worker.enqueue(txn(0))
        for tid in range(1, 10):
            worker.enqueue(txn(tid))
        gate.set()
        assert mark.wait(9, 10)
    finally:
        worker.close()
    assert callbacks.applied == list(range(10))
    assert all(len(b) <= 4 for b in callbacks.batches)
    assert [t for b in callbacks.batches for t in b] == callbacks.applied[
        -sum(len(b) for b in callbacks.batches) :
    ]


def test_linger_waits_for_a_fuller_batch() -> None:
    callbacks = BatchCallbacks()
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, max_batch=10, linger=5.0, initial_backoff=0.01)
    worker.start()
    try:
        for tid in range(4):
            worker.enqueue(txn(tid))  # fewer than max_batch: the worker lingers
        assert not mark.wait(0, 0.3)
        for tid in range(4, 10):
            worker.enqueue(txn(tid))  # the batch is full: applied at once, long before the linger ends
        assert mark.wait(9, 3)
    finally:
        worker.close()
    assert callbacks.batches == [list(range(10))]


class FailingBatchCallbacks(BatchCallbacks):
    """A batch whose third transaction fails once, reported as the SQL framework does."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        from waltz.errors import TransactionApplyError

        if not self.failed:
            self.failed = True
            self.applied.extend(t.transaction_id for t in transactions[:2])
            raise TransactionApplyError(4, transactions[2].transaction_id, KeyError("no such row"))
        super().apply_transactions([t for t in transactions if t.transaction_id not in self.applied])


def test_a_batch_failure_is_reported_for_the_transaction_that_failed() -> None:
    callbacks = FailingBatchCallbacks()
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, max_batch=10, linger=1.0, initial_backoff=0.01)
    worker.start()
    try:
        for tid in range(5):
            worker.enqueue(txn(tid))
        assert mark.wait(4, 10)
    finally:
        worker.close()
    assert callbacks.errors == [(4, 2, "'no such row'")]  # transaction 2 and its cause, not 0
    assert callbacks.applied == list(range(5))


def test_without_the_hook_each_transaction_of_a_run_is_applied_and_marked_in_turn() -> None:
    marks_seen: list[int] = []

    class Watching(Callbacks):
        def apply_transaction(self, transaction: Transaction) -> None:
            marks_seen.append(mark.value)  # the mark when this one is applied: its predecessor
            super().apply_transaction(transaction)

    callbacks = Watching(fail_times=2)
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, initial_backoff=0.01)
    worker.enqueue_many([(txn(tid), None) for tid in range(6)])  # one run, taken at once
    worker.start()
    try:
        assert mark.wait(5, 10), f"applied only up to {mark.value}: {callbacks.applied}"
    finally:
        worker.close()
    assert callbacks.applied == list(range(6))
    # 3 failed twice and was retried alone: 0..2 were applied and marked before it, 4 and 5 after.
    assert marks_seen == [-1, 0, 1, 2, 2, 2, 3, 4]
    assert callbacks.errors == [(4, 3, "database down")] * 2


def test_close_stops_after_the_apply_in_progress_even_within_a_run() -> None:
    started = threading.Event()
    release = threading.Event()

    class Slow(Callbacks):
        def apply_transaction(self, transaction: Transaction) -> None:
            super().apply_transaction(transaction)
            if transaction.transaction_id == 1:
                started.set()
                release.wait(10)

    callbacks = Slow()
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark)
    worker.enqueue_many([(txn(tid), None) for tid in range(6)])  # one run, taken at once
    worker.start()
    assert started.wait(10)
    closing = threading.Thread(target=worker.close)
    closing.start()
    wait_until(worker._closed.is_set, timeout=10, what="the worker to be closing")
    release.set()
    closing.join(10)
    assert callbacks.applied == [0, 1]  # 2..5 of the same run are left, as queued ones are
    assert mark.value == 1


class AbsorbingCallbacks(BatchCallbacks):
    """Absorbs each batch before it is applied; notes the order of events and the marks seen."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.absorbed_mark: Watermark | None = None
        self.marks_at_apply: list[int] = []

    @property
    def absorbs_transactions(self) -> bool:
        return True

    def absorb_transactions(self, transactions: Sequence[Transaction]) -> None:
        assert all(t.data_loaded for t in transactions)
        self.events.append(("absorb", transactions[-1].transaction_id))

    def absorb_floor(self, partition_id: int, mark: int) -> None:
        self.events.append(("floor", mark))

    def absorb_stopped(self, partition_id: int) -> None:
        self.events.append(("stopped", partition_id))

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        assert self.absorbed_mark is not None
        self.marks_at_apply.append(self.absorbed_mark.value)
        self.events.append(("apply", transactions[-1].transaction_id))
        super().apply_transactions(transactions)

    def apply_transaction(self, transaction: Transaction) -> None:
        self.apply_transactions([transaction])


def test_absorbing_callbacks_see_each_batch_before_it_is_applied() -> None:
    callbacks = AbsorbingCallbacks()
    applied, absorbed = Watermark(-1), Watermark(-1)
    callbacks.absorbed_mark = absorbed
    worker = ApplyWorker(4, callbacks, applied, initial_backoff=0.01, absorbed=absorbed)
    worker.start()
    try:
        worker.enqueue_many([(txn(tid), None) for tid in range(5)])
        assert applied.wait(4, 10)
        worker.set_floor(9)  # found applied at a mount: absorbed and applied move together
        worker.enqueue(txn(10))
        assert applied.wait(10, 10)
    finally:
        worker.close()
    assert callbacks.applied == [0, 1, 2, 3, 4, 10]
    absorbs = [i for i, (kind, _) in enumerate(callbacks.events) if kind == "absorb"]
    applies = [i for i, (kind, _) in enumerate(callbacks.events) if kind == "apply"]
    assert len(absorbs) == len(applies) and all(a < b for a, b in zip(absorbs, applies, strict=True))
    # Each batch was absorbed, and the absorbed mark moved, before its apply ran.
    lasts = [last for kind, last in callbacks.events if kind == "apply"]
    assert callbacks.marks_at_apply == lasts
    assert ("floor", 9) in callbacks.events
    assert absorbed.value == applied.value == 10
    # Closed (the partition unmounted, or the client closing): told once, after the last apply.
    assert callbacks.events[-1] == ("stopped", 4)
    assert callbacks.events.count(("stopped", 4)) == 1


def test_callbacks_that_do_not_absorb_move_the_absorbed_mark_with_the_applies() -> None:
    callbacks = BatchCallbacks()
    applied, absorbed = Watermark(-1), Watermark(-1)
    worker = ApplyWorker(4, callbacks, applied, initial_backoff=0.01, absorbed=absorbed)
    worker.start()
    try:
        worker.enqueue_many([(txn(tid), None) for tid in range(3)])
        assert applied.wait(2, 10)
    finally:
        worker.close()
    assert absorbed.value == 2


class HeldCallbacks(Callbacks):
    """Callbacks whose own check holds transaction 3 (a genesis) until ``parent_applied`` is set,
    as the SQL framework's does (``GenesisHeldError``)."""

    def __init__(self) -> None:
        super().__init__()
        self.parent_applied = threading.Event()
        self.held = 0

    def apply_transaction(self, transaction: Transaction) -> None:
        if transaction.transaction_id == 3 and not self.parent_applied.is_set():
            self.held += 1
            raise GenesisHeldError("test", 4, 0, 2, 1)
        super().apply_transaction(transaction)


def test_a_genesis_the_callbacks_hold_is_a_pause_not_a_failure() -> None:
    callbacks = HeldCallbacks()
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, initial_backoff=0.01)
    worker.start()
    try:
        worker.set_floor(2)
        worker.enqueue(txn(3))
        worker.enqueue(txn(4))
        wait_until(lambda: callbacks.held >= 3, timeout=10, what="the genesis tried three times")
        assert worker.holding and worker.healthy and worker.failures == 0
        assert callbacks.errors == [] and mark.value == 2
        callbacks.parent_applied.set()
        assert mark.wait(4, 10)
        assert not worker.holding and worker.healthy
    finally:
        worker.close()
    assert callbacks.applied == [3, 4] and callbacks.errors == []


@pytest.mark.parametrize("mounts_parent", [True, False], ids=["own-parent-mark", "callbacks-parent-mark"])
def test_a_childs_genesis_waits_for_its_parents_applied_mark(mounts_parent: bool) -> None:
    # Partition 4, a child of partition 0 whose barrier is 2: its log starts with the genesis at 3.
    callbacks = Callbacks()
    parent = Watermark(1)
    database_mark = [1]  # the parent's mark in the callbacks' database (another instance's)
    hold = GenesisHold(
        SplitOrigin(child=4, epoch=1, parent=0, barrier=2),
        lambda pid: parent if mounts_parent else None,
        lambda pid: database_mark[0],
    )
    mark = Watermark(-1)
    worker = ApplyWorker(4, callbacks, mark, initial_backoff=0.01, hold=hold)
    worker.start()
    try:
        worker.set_floor(2)
        worker.enqueue(txn(3))
        worker.enqueue(txn(4))
        wait_until(lambda: worker.holding, timeout=10, what="the genesis held")
        assert callbacks.applied == [] and mark.value == 2 and worker.healthy
        assert callbacks.errors == [] and hold.last_parent_mark == 1
        if mounts_parent:
            parent.advance(2)
        else:
            database_mark[0] = 2
        assert mark.wait(4, 10)
        assert not worker.holding
    finally:
        worker.close()
    assert callbacks.applied == [3, 4] and callbacks.errors == []
