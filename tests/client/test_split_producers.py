"""Four producers keep committing read-modify-writes while the cluster splits from 2 to 4
partitions, and no update is lost or doubled (docs/design/splits.md "Why no update is lost",
"Clients across a split").

Real storage and server processes and a real ZooKeeper. Four clients, each with its own in-memory
store that mounts every partition (auto-mount), bump counters: one hot key, whose partition moves
to a new child in the split (``2 mod 2 = 0``, ``2 mod 4 = 2``), and many keys spread over every
partition. A bump reads the key's counter in its client's store and appends ``value + 1`` under the
key's WRITE lock, routed by ``key mod count``. Upstream Waltz's validate, per key: the values the
log holds for a key are exactly ``1 .. n`` for its ``n`` commits, each once, and every store ends
with ``n``; an update lost to a stale read would repeat a value, and one applied twice would
count twice.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

from tests.admin.test_split_run import connect
from tests.client.test_epoch_routing import client_config
from tests.client.test_split_mounts import SplitStore
from tests.services.server.test_epoch_refusals import start_cluster
from waltz import BytesSerializer, PartitionLocalLock, Transaction, WaltzClient
from waltz.admin.split_run import SplitRun
from waltz.client.context import TransactionBuilder, TransactionContext
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.local.processes import wait_until

#: Producers (clients), each in a thread of its own.
PRODUCERS = 4
#: The hot key: every producer bumps it; it moves from partition 0 to the new child 2.
HOT = 2
#: Keys besides the hot one (every partition before and after the split has some).
KEYS = 32
#: Bumps a producer keeps in flight (half on the hot key).
IN_FLIGHT = 4
#: Seconds at most for any wait.
WAIT = 120.0


class CounterStore(SplitStore):
    """A :class:`SplitStore` whose records are counter values: ``key:value``."""

    def __init__(self, start: Mapping[int, int]) -> None:
        super().__init__(start)
        self.counters: dict[int, int] = defaultdict(int)
        self.values: dict[int, list[int]] = defaultdict(list)

    def apply_transaction(self, transaction: Transaction) -> None:
        data = transaction.get_data(BytesSerializer())
        if data.startswith(b"bump "):
            key, value = (int(part) for part in data[5:].split(b":"))
            with self.lock:
                self.counters[key] = value
                self.values[key].append(value)
        super().apply_transaction(transaction)

    def read(self, key: int) -> int:
        with self.lock:
            return self.counters[key]


class Bump(TransactionContext):
    """Reads a key's counter in the store and appends ``value + 1`` under the key's WRITE lock."""

    def __init__(self, store: CounterStore, key: int) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.lock_failures = 0

    def partition_id(self, num_partitions: int) -> int:
        return self.key % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(b"bump %d:%d" % (self.key, self.store.read(self.key) + 1))
        builder.set_write_locks([PartitionLocalLock("counter", self.key)])
        return True

    def on_lock_failure(self) -> None:
        self.lock_failures += 1


def test_four_producers_lose_and_double_no_update_on_a_hot_lock_and_many_locks_across_a_split(
    tmp_path: Path, zookeeper: object
) -> None:
    with start_cluster(tmp_path / "cluster", zookeeper) as cluster:
        marks = {pid: found.high_water_mark for pid, found in cluster.wait_ready(60).items()}
        stores = [CounterStore({**marks, 2: -1, 3: -1}) for _ in range(PRODUCERS)]
        clients = [WaltzClient(store, client_config(cluster)) for store in stores]
        outcomes: list[list[tuple[Bump, Future[Outcome]]]] = [[] for _ in range(PRODUCERS)]
        stop = threading.Event()
        failures: list[BaseException] = []

        def produce(index: int) -> None:
            rng = random.Random(index)
            client, store = clients[index], stores[index]
            try:
                for _ in range(10_000):
                    if stop.is_set():
                        return
                    batch = [
                        Bump(store, HOT if i % 2 == 0 else rng.randrange(KEYS)) for i in range(IN_FLIGHT)
                    ]
                    futures = [client.submit(bump) for bump in batch]
                    outcomes[index].extend(zip(batch, futures, strict=True))
                    for future in futures:
                        future.result(WAIT)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        try:
            for thread in threads:
                thread.start()

            def submitted() -> int:
                return sum(len(done) for done in outcomes)

            wait_until(lambda: submitted() >= 100, timeout=WAIT, what="100 bumps before the split")
            with connect(cluster) as admin:
                report = SplitRun(admin.cluster, wait=60).run(4)
            assert report.complete, report
            after_split = submitted()
            wait_until(lambda: submitted() >= after_split + 200, timeout=WAIT, what="200 bumps after it")
        finally:
            stop.set()
            for thread in threads:
                thread.join(WAIT)
        try:
            assert not failures, failures
            assert all(not thread.is_alive() for thread in threads)
            commits: dict[int, int] = defaultdict(int)
            where: dict[int, set[int]] = defaultdict(set)
            for done in outcomes:
                for bump, future in done:
                    outcome = future.result(WAIT)
                    assert outcome.kind is OutcomeKind.COMMITTED, outcome
                    assert outcome.partition_id is not None and outcome.transaction_id is not None
                    commits[bump.key] += 1
                    where[bump.key].add(outcome.partition_id)
            # The hot key committed in its parent before the split and in the new child after.
            assert where[HOT] == {0, 2}, where[HOT]
            assert {p for places in where.values() for p in places} == {0, 1, 2, 3}
            for client in clients:
                for pid in range(4):
                    mark = client.get_high_water_mark(pid, 30)
                    assert client.wait_applied(pid, mark, 60), (pid, mark)
        finally:
            for client in clients:
                client.close()
        # Validate, per key: the log's values are exactly 1 .. n, once each, in every store.
        for store in stores:
            assert store.errors == []
            for key, n in commits.items():
                assert sorted(store.values[key]) == list(range(1, n + 1)), (key, n, store.values[key][-5:])
                assert store.counters[key] == n
        assert sum(commits.values()) >= 300
        lock_failures = sum(bump.lock_failures for done in outcomes for bump, _ in done)
        assert lock_failures > 0  # the hot key was contended: the lock checks had work to do
