"""Application stand-ins for the client tests: an in-memory database and transaction contexts."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from waltz import (
    BytesSerializer,
    JsonSerializer,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
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


class Increment(TransactionContext):
    """A read-modify-write of the store's counter under a WRITE lock (seed 001's counter).

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
