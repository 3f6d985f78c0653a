"""Application stand-ins for the client tests: an in-memory database and transaction contexts."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from waltz import (
    BytesSerializer,
    JsonSerializer,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)


@dataclass(frozen=True, slots=True)
class Applied:
    """One applied transaction as the application saw it."""

    transaction_id: int
    client_id: int
    header: int
    data: bytes


class MemoryStore(WaltzClientCallbacks):
    """An application database in memory, shareable by several clients (like the SQL callbacks).

    Per partition: the high-water mark, the applied transactions, and a counter value (for
    read-modify-write tests, the data ``{"set": n}`` sets it). A transaction at or below the mark is
    skipped (another client applied it); one above mark + 1 is a gap, recorded as an error.

    Args:
        start: partition -> the high-water mark to start from (the partition's current one).
    """

    def __init__(self, start: Mapping[int, int]) -> None:
        self.lock = threading.RLock()
        self.marks = dict(start)
        self.applied: dict[int, list[Applied]] = {pid: [] for pid in start}
        self.values: dict[int, int] = dict.fromkeys(start, 0)
        self.skipped = 0
        self.skipped_by_partition: dict[int, int] = dict.fromkeys(start, 0)
        self.errors: list[str] = []
        self.calls: dict[int, list[int]] = {pid: [] for pid in start}

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self.lock:
            return self.marks[partition_id]

    def snapshot(self, partition_id: int) -> tuple[int, int]:
        """The partition's high-water mark and counter value, read together."""
        with self.lock:
            return self.marks[partition_id], self.values[partition_id]

    def apply_transaction(self, transaction: Transaction) -> None:
        pid, tid = transaction.partition_id, transaction.transaction_id
        data = transaction.get_data(BytesSerializer())  # lazily, over RPC unless it is ours
        with self.lock:
            self.calls[pid].append(tid)
            mark = self.marks[pid]
            if tid <= mark:
                self.skipped += 1
                self.skipped_by_partition[pid] += 1
                return
            if tid != mark + 1:
                self.errors.append(f"partition {pid}: gap, transaction {tid} after {mark}")
                raise AssertionError(self.errors[-1])
            self.applied[pid].append(Applied(tid, transaction.req_id.client_id, transaction.header, data))
            if data.startswith(b"{"):
                value = JsonSerializer().deserialize(data)
                if "set" in value:
                    self.values[pid] = value["set"]
            self.marks[pid] = tid

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append(f"partition {partition_id}, transaction {transaction_id}: {exception!r}")


class PrefetchingStore(MemoryStore):
    """A store fed in batches that asks the client to load each batch's data before the apply call."""

    prefetch_transaction_data = True

    def __init__(self, start: Mapping[int, int]) -> None:
        super().__init__(start)
        self.loaded_before_apply: list[bool] = []

    def apply_transactions(self, transactions: Sequence[Transaction]) -> None:
        self.loaded_before_apply.extend(t.data_loaded for t in transactions)
        for transaction in transactions:
            self.apply_transaction(transaction)


@dataclass
class Outcomes:
    """What a context's callbacks saw."""

    executions: int = 0
    completions: list[bool] = field(default_factory=list)
    exceptions: list[BaseException] = field(default_factory=list)
    lock_failures: int = 0
    applications: int = 0


class Append(TransactionContext):
    """Appends ``data`` to ``partition`` (optionally with a WRITE lock and a fixed mark)."""

    def __init__(
        self,
        partition: int,
        data: bytes,
        *,
        header: int = 0,
        write_lock: PartitionLocalLock | None = None,
        high_water_mark: int | None = None,
        once: bool = False,
    ) -> None:
        super().__init__()
        self.partition = partition
        self.data = data
        self.header = header
        self.write_lock = write_lock
        self.high_water_mark = high_water_mark
        self.once = once
        self.outcomes = Outcomes()

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        self.outcomes.executions += 1
        if self.once and self.outcomes.executions > 1:
            return False  # a retry: this context only ever tries once
        builder.set_header(self.header)
        builder.set_raw_data(self.data)
        if self.write_lock is not None:
            builder.set_write_locks([self.write_lock])
        if self.high_water_mark is not None:
            builder.set_client_high_water_mark(self.high_water_mark)
        return True

    def on_completion(self, result: bool) -> None:
        self.outcomes.completions.append(result)

    def on_exception(self, exception: BaseException) -> None:
        self.outcomes.exceptions.append(exception)

    def on_lock_failure(self) -> None:
        self.outcomes.lock_failures += 1

    def on_application(self) -> None:
        self.outcomes.applications += 1


class HeldAppend(Append):
    """An :class:`Append` whose ``execute`` blocks (``execute_blocks``: its first attempt runs on the
    client's attempt threads), held at each execute until ``go`` is set."""

    execute_blocks = True

    def __init__(self, partition: int, data: bytes, go: threading.Event) -> None:
        super().__init__(partition, data)
        self.go = go
        self.entered = threading.Event()

    def execute(self, builder: TransactionBuilder) -> bool:
        self.entered.set()
        if not self.go.wait(60):
            raise TimeoutError("the test never let the attempt go on")
        return super().execute(builder)


class Increment(TransactionContext):
    """A read-modify-write of the store's counter under a WRITE lock.

    The counter of docs/design/overview.md "Why the log is the source of truth".

    It reads the counter and the high-water mark together, and writes ``{"set": value + 1}``; the
    lock check refuses the append when the read was stale.
    """

    def __init__(self, store: MemoryStore, partition: int, lock: PartitionLocalLock) -> None:
        super().__init__()
        self.store = store
        self.partition = partition
        self.lock = lock
        self.outcomes = Outcomes()

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        self.outcomes.executions += 1
        mark, value = self.store.snapshot(self.partition)
        builder.set_client_high_water_mark(mark)
        builder.set_write_locks([self.lock])
        builder.set_transaction_data({"set": value + 1}, JsonSerializer())
        return True

    def on_completion(self, result: bool) -> None:
        self.outcomes.completions.append(result)

    def on_lock_failure(self) -> None:
        self.outcomes.lock_failures += 1


def run_with_cuts(
    client_config: WaltzClientConfig,
    log_start: dict[int, int],
    per_client: int,
    cut: Callable[[list[WaltzClient], random.Random], None] | None = None,
) -> None:
    """Two clients append ``per_client`` transactions each while connections are cut at random.

    ``cut(clients, rng)`` cuts connections; by default the clients drop their own connections
    (also right after some submits). Asserts the fault-test invariants.
    """
    stores = [MemoryStore(log_start), MemoryStore(log_start)]
    rng = random.Random(20261122)
    in_client = cut is None
    with WaltzClient(stores[0], client_config) as first, WaltzClient(stores[1], client_config) as second:
        clients = [first, second]
        submitted: list[tuple[Append, object]] = []
        done = threading.Event()
        cuts = 0

        def cutter() -> None:
            nonlocal cuts
            while not done.wait(rng.uniform(0.01, 0.08)):
                if cut is None:
                    rng.choice(clients)._core.drop_connections("cut by the fault test")
                else:
                    cut(clients, rng)
                cuts += 1

        def run(client: WaltzClient) -> None:
            nonlocal cuts
            local = random.Random(client.client_id)
            # Groups of 10 in flight, so that the run lasts long enough for many cuts; some cuts
            # land right after a submit (appends still in buffers or in the server's pipeline).
            for start in range(0, per_client, 10):
                group = []
                for i in range(start, min(per_client, start + 10)):
                    context = Append(i % 2, f"{client.client_id}/{i}".encode())
                    group.append(client.submit(context))
                    submitted.append((context, group[-1]))
                    if in_client and local.random() < 0.02:
                        client._core.drop_connections("cut by the fault test, right after a submit")
                        cuts += 1
                for future in group:
                    future.result(120)

        chaos = threading.Thread(target=cutter)
        chaos.start()
        try:
            threads = [threading.Thread(target=run, args=(c,)) for c in clients]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            ids = [future.result(120).transaction_id for _, future in submitted]  # type: ignore[attr-defined]
        finally:
            done.set()
            chaos.join(10)
        assert cuts > 3, "too few cuts to mean anything"
        marks = {pid: first.get_high_water_mark(pid) for pid in (0, 1)}
        for client in clients:
            for pid, mark in marks.items():
                assert client.wait_applied(pid, mark, 60), (
                    f"client {client.client_id} stuck on partition {pid}"
                )

    for store in stores:
        assert store.errors == []
    for pid in (0, 1):
        sequences = [[(a.transaction_id, a.data) for a in store.applied[pid]] for store in stores]
        assert sequences[0] == sequences[1]
        assert [t for t, _ in sequences[0]] == list(range(log_start[pid] + 1, marks[pid] + 1))
    log = {(pid, a.transaction_id): a.data for pid in (0, 1) for a in stores[0].applied[pid]}
    assert len(log) == len(set(log.values())) == len(submitted) == 2 * per_client  # each exactly once
    for (context, _), transaction_id in zip(submitted, ids, strict=True):
        assert transaction_id is not None
        assert log[(context.partition, transaction_id)] == context.data
        assert context.outcomes.completions == [True]


class BreakableStore(MemoryStore):
    """A memory store whose ``apply_transaction`` raises while ``broken`` is set; its
    ``uncaught_exception`` stays quiet (the tests read ``unhealthy_partitions()`` and the
    client's counters, not the log)."""

    def __init__(self, start: Mapping[int, int]) -> None:
        super().__init__(start)
        self.broken = threading.Event()

    def apply_transaction(self, transaction: Transaction) -> None:
        if self.broken.is_set():
            raise RuntimeError(f"broken on purpose at transaction {transaction.transaction_id}")
        super().apply_transaction(transaction)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        pass  # expected while broken
