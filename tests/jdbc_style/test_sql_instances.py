"""Three application instances (separate processes) apply one Waltz log into one shared database.

Each instance (``sql_instance.py``) mounts every partition and applies every transaction it is
fed through :class:`~waltz.jdbc_style.AbstractClientCallbacksForSQL` with group apply; the
framework must make the database hold every transaction exactly once, even though all three
instances receive all of them, and even when one instance is killed (SIGKILL) in the middle of an
apply whose database transaction has already written. The test process writes the transactions
with a client of its own.
"""

from __future__ import annotations

import os
import random
import re
import sys
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
import support

from tests.jdbc_style.sql_instance import FAILPOINT_PATTERN, applied_transactions, metadata
from waltz import (
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz.jdbc_style import create_framework_engine
from waltz.jdbc_style.skips import list_marks
from waltz.local.cluster import LocalCluster
from waltz.local.processes import ManagedProcess, wait_until

INSTANCE_SCRIPT = Path(__file__).with_name("sql_instance.py")
#: Transactions the test submits before waiting for their outcomes.
WRITE_CHUNK = 100
#: Extra single transactions written to the failpoint's partition when the instance with the
#: failpoint lost every race for the partition's transactions during the main run.
MAX_PROVOKING_WRITES = 100


class LogFollower(WaltzClientCallbacks):
    """The writer's callbacks: start at the partitions' current marks, follow them, store nothing.

    Args:
        start: partition -> its high-water mark now.
    """

    def __init__(self, start: Mapping[int, int]) -> None:
        self._lock = threading.Lock()
        self.marks = dict(start)
        self.errors: list[str] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self._lock:
            return self.marks[partition_id]

    def apply_transaction(self, transaction: Transaction) -> None:
        with self._lock:
            self.marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append(f"partition {partition_id} transaction {transaction_id}: {exception!r}")


class Write(TransactionContext):
    """Appends ``data`` to ``partition`` (no locks)."""

    def __init__(self, partition: int, data: bytes) -> None:
        super().__init__()
        self.partition = partition
        self.data = data

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(self.data)
        return True


@dataclass
class Instances:
    """The instance processes of one test and what they share."""

    process_factory: support.ProcessFactory
    cluster: LocalCluster
    db_url: str
    cluster_name: str
    work_dir: Path
    processes: dict[str, ManagedProcess] = field(default_factory=dict)

    def uncaught_file(self, name: str) -> Path:
        return self.work_dir / f"uncaught-{name}.txt"

    def start(self, name: str, kill_at: tuple[int, int] | None = None) -> ManagedProcess:
        """Start instance ``name`` (not waiting for it to mount)."""
        ready = self.work_dir / f"ready-{name}"
        args = [
            sys.executable,
            str(INSTANCE_SCRIPT),
            "--db",
            self.db_url,
            "--zookeeper",
            self.cluster.zookeeper_connect_string,
            "--root",
            self.cluster.root,
            "--cluster-name",
            self.cluster_name,
            "--name",
            name,
            "--ready-file",
            str(ready),
            "--uncaught-file",
            str(self.uncaught_file(name)),
        ]
        if kill_at is not None:
            args += ["--kill-at", f"{kill_at[0]}:{kill_at[1]}"]
        # An application host's environment: the client role's credential and certificate.
        env = {**os.environ, **self.cluster.client_env()}
        process = self.process_factory(args, name=name, env=env)
        process.start()
        self.processes[name] = process
        return process

    def wait_ready(self, name: str) -> None:
        ready = self.work_dir / f"ready-{name}"
        self.processes[name].wait_ready(
            ready.exists, timeout=60, what=f"instance {name} to mount every partition"
        )

    def uncaught(self) -> dict[str, str]:
        """Instance -> the uncaught_exception calls it recorded (only instances that had some)."""
        found = {}
        for name in self.processes:
            path = self.uncaught_file(name)
            if path.exists():
                found[name] = path.read_text()
        return found


@pytest.fixture
def instances(
    process_factory: support.ProcessFactory,
    sql_cluster_ready: LocalCluster,
    app_db_url: str,
    tmp_path: Path,
) -> Iterator[Instances]:
    """Instance processes on the cluster and the database (with ``applied_transactions`` created)."""
    engine = create_framework_engine(app_db_url)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    work_dir = tmp_path / "instances"
    work_dir.mkdir()
    running = Instances(
        process_factory, sql_cluster_ready, app_db_url, f"instances-{support.unique_suffix()}", work_dir
    )
    try:
        yield running
    finally:
        # Before the database is dropped (process_factory would kill them after that).
        for process in running.processes.values():
            process.kill()


def database_marks(engine: sa.Engine, cluster_name: str) -> dict[int, int]:
    return {row.partition_id: row.high_water_mark for row in list_marks(engine, cluster_name)}


def applied_rows(engine: sa.Engine) -> list[tuple[int, int, str, int]]:
    t = applied_transactions
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.partition_id, t.c.transaction_id, t.c.instance, t.c.data_crc))
        return [(int(p), int(x), str(i), int(c)) for p, x, i, c in rows]


def run_three_instances_with_a_crash(instances: Instances, count: int, seed: int) -> None:
    """Three instances apply ``count`` new transactions (and the log before them); one is killed
    by its failpoint in the middle and replaced; then the database must hold the log exactly once."""
    cluster = instances.cluster
    start = {pid: owner.high_water_mark for pid, owner in cluster.wait_ready(30).items()}
    partitions = sorted(start)
    rng = random.Random(seed)
    plan = [(rng.choice(partitions), rng.randbytes(rng.randint(1, 300))) for _ in range(count)]
    kill_partition = rng.choice(partitions)
    on_kill_partition = sum(1 for pid, _ in plan if pid == kill_partition)
    kill_at = (kill_partition, start[kill_partition] + on_kill_partition // 2 + 1)

    instances.start("inst1")
    killed = instances.start("inst2", kill_at=kill_at)
    instances.start("inst3")
    for name in ("inst1", "inst2", "inst3"):
        instances.wait_ready(name)

    engine = create_framework_engine(instances.db_url)
    config = WaltzClientConfig(
        **cluster.client_settings(),
        zookeeper_session_timeout=10.0,
    )
    written: dict[tuple[int, int], int] = {}  # (partition, transaction) -> CRC-32 of the data
    follower = LogFollower(start)
    try:
        with WaltzClient(follower, config) as writer:

            def write(batch: list[tuple[int, bytes]]) -> list[int]:
                futures = [writer.submit(Write(pid, data)) for pid, data in batch]
                ids = []
                for (pid, data), future in zip(batch, futures, strict=True):
                    transaction_id = future.result(60).transaction_id
                    assert isinstance(transaction_id, int)
                    written[(pid, transaction_id)] = zlib.crc32(data)
                    ids.append(transaction_id)
                return ids

            for offset in range(0, count, WRITE_CHUNK):
                write(plan[offset : offset + WRITE_CHUNK])

            # Let the instances catch up with the writes (inst2 dies on the way, usually).
            last_on_kill_partition = max(tid for pid, tid in written if pid == kill_partition)
            wait_until(
                lambda: (
                    killed.returncode is not None
                    or database_marks(engine, instances.cluster_name).get(kill_partition, -1)
                    >= last_on_kill_partition
                ),
                timeout=60 + count / 50,
                what=(
                    f"partition {kill_partition} applied up to {last_on_kill_partition}, or inst2 dead "
                    f"(marks now {database_marks(engine, instances.cluster_name)})"
                ),
            )
            # The instances race for every transaction: the one with the failpoint may have lost
            # every race on its partition after the failpoint's ID. Give it more chances.
            for _ in range(MAX_PROVOKING_WRITES):
                if killed.returncode is not None:
                    break
                (transaction_id,) = write([(kill_partition, rng.randbytes(32))])
                wait_until(
                    lambda tid=transaction_id: (
                        killed.returncode is not None
                        or database_marks(engine, instances.cluster_name).get(kill_partition, -1) >= tid
                    ),
                    timeout=30,
                    what=f"partition {kill_partition} transaction {transaction_id} applied, or inst2 dead",
                )
            wait_until(
                lambda: killed.returncode is not None,
                timeout=30,
                what=f"inst2 to die at its failpoint (partition {kill_at[0]}, transaction >= {kill_at[1]})",
            )
            assert killed.returncode == -9, f"inst2 ended with {killed.returncode}, not SIGKILL (-9)"
            failpoint = re.search(FAILPOINT_PATTERN, killed.log_path.read_text())  # type: ignore[union-attr]
            assert failpoint is not None, "inst2 died without logging its failpoint"
            died_on = (int(failpoint["partition"]), int(failpoint["transaction"]))

            # A replacement for the killed instance, without the failpoint.
            instances.start("inst2b")
            instances.wait_ready("inst2b")

            writer.flush(30)
            server_marks = {pid: writer.get_high_water_mark(pid) for pid in partitions}

        new_per_partition = {pid: sum(1 for p, _ in written if p == pid) for pid in partitions}
        assert server_marks == {pid: start[pid] + new_per_partition[pid] for pid in partitions}, (
            "the log holds transactions the test did not write (another writer on the cluster?)"
        )

        wait_until(
            lambda: database_marks(engine, instances.cluster_name) == server_marks,
            timeout=60,
            what=(
                f"the database's marks to reach the server's {server_marks} "
                f"(now {database_marks(engine, instances.cluster_name)})"
            ),
        )
        for name in ("inst1", "inst3", "inst2b"):
            assert instances.processes[name].is_running(), f"instance {name} exited"

        rows = applied_rows(engine)
        by_partition: dict[int, list[int]] = {pid: [] for pid in partitions}
        for pid, transaction_id, _, _ in rows:
            by_partition[pid].append(transaction_id)
        for pid in partitions:
            assert len(by_partition[pid]) == server_marks[pid] + 1, (
                f"partition {pid}: {len(by_partition[pid])} rows for high-water mark {server_marks[pid]}"
            )
            assert sorted(by_partition[pid]) == list(range(server_marks[pid] + 1)), (
                f"partition {pid}: transaction IDs are not exactly 0..{server_marks[pid]}"
            )
        crcs = {(pid, tid): crc for pid, tid, _, crc in rows}
        wrong = {key: (crcs.get(key), crc) for key, crc in written.items() if crcs.get(key) != crc}
        assert wrong == {}, f"(partition, transaction) -> (applied CRC, written CRC) differ: {wrong}"
        appliers = {(pid, tid): instance for pid, tid, instance, _ in rows}
        assert appliers[died_on] != "inst2", (
            f"the row inst2 wrote for {died_on} before it was killed survived its rolled-back transaction"
        )
        assert instances.uncaught() == {}
        assert follower.errors == []

        for name in ("inst1", "inst3", "inst2b"):
            returncode = instances.processes[name].terminate(timeout=20)
            assert returncode == 0, f"instance {name} exited with {returncode} on SIGTERM"
        assert database_marks(engine, instances.cluster_name) == server_marks
        assert len(applied_rows(engine)) == sum(mark + 1 for mark in server_marks.values())
    finally:
        engine.dispose()


def test_three_instances_apply_every_transaction_exactly_once_despite_a_crash(
    instances: Instances,
) -> None:
    run_three_instances_with_a_crash(instances, count=1_000, seed=20260101)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_three_instances_apply_ten_thousand_transactions_exactly_once_despite_a_crash(
    instances: Instances,
) -> None:
    run_three_instances_with_a_crash(instances, count=10_000, seed=20260102)
