"""``waltz chaos --split-to``: the log splits while the clients write, the server owning a parent
partition is killed in the middle of the handover, and every check covers the partitions of both
counts (docs/chaos.md "A split under faults").

The run: 2 -> 4 partitions under the counter workload (read-modify-write increments under each
key's WRITE lock: a lost update across the split shows as a repeated value). The pieces: the
options and the schedule, the callbacks that start a new partition at its genesis, the reader that
passes split records over, and the gap and replica checks that count from where a log starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from waltz.chaos import ChaosOptions, FaultKind, parse_fault_kinds, run_chaos
from waltz.chaos.checks import LogObserver, LogReading, check_gaps, check_replicas_on_disk
from waltz.chaos.schedule import DEFAULT_FAULTS, NAMESPACE_DEFAULT_FAULTS
from waltz.chaos.sequence import ChecksumCallbacks, counter_key_for, counter_payload
from waltz.client.transaction import Transaction
from waltz.committed.plan import plan_offline
from waltz.committed.reads import read_committed
from waltz.errors import ConfigurationError
from waltz.protocol.records import ReqId
from waltz.protocol.split_records import SPLIT_RECORD_HEADER, SplitBarrier, SplitGenesis, decode_split_record

from .test_chaos_short import _require_zookeeper


def _transaction(partition: int, transaction_id: int, data: bytes, header: int = 0) -> Transaction:
    return Transaction(partition, transaction_id, ReqId(1, 1, partition, transaction_id), header, None, data)


def _genesis(child: int, barrier: int) -> Transaction:
    data = SplitGenesis(epoch=1, count=4, previous_count=2, parent=child % 2, barrier=barrier).encode()
    return _transaction(child, barrier + 1, data, SPLIT_RECORD_HEADER)


# --- options and schedule -------------------------------------------------------------------------


def test_split_options_are_checked_and_the_split_is_scheduled_once() -> None:
    options = ChaosOptions(partitions=2, split_to=4, split_at=0.4, workload="counter", fault_count=5)
    options.validate()
    schedule = options.make_schedule()
    splits = [f for f in schedule if f.kind is FaultKind.KILL_SERVER_SPLITTING]
    assert len(splits) == 1 and splits[0].at == 0.4 and splits[0].targets == (0,)
    assert len(schedule) == 6 and [f.at for f in schedule] == sorted(f.at for f in schedule)
    assert "kill-server-splitting of partition 0" in splits[0].describe()
    assert "--split-to 4 --split-at 0.4" in options.replay_command()
    # The random draw of the other faults is the same with or without the split.
    without = ChaosOptions(partitions=2, workload="counter", fault_count=5).make_schedule()
    assert [f for f in schedule if f.kind is not FaultKind.KILL_SERVER_SPLITTING] == without
    # Never drawn at random, never in "all".
    assert FaultKind.KILL_SERVER_SPLITTING not in DEFAULT_FAULTS
    assert FaultKind.KILL_SERVER_SPLITTING not in NAMESPACE_DEFAULT_FAULTS
    assert FaultKind.KILL_SERVER_SPLITTING not in parse_fault_kinds("all")

    for bad, message in (
        (ChaosOptions(partitions=4, split_to=6), "no split of 4 partitions"),
        (ChaosOptions(partitions=4, split_to=4), "no split of 4 partitions"),
        (ChaosOptions(partitions=2, split_to=4, workload="ledger"), "raw and counter workloads"),
        (ChaosOptions(partitions=2, split_to=4, archive=True), "archiver does not follow a split"),
        (ChaosOptions(partitions=2, split_to=4, split_at=1.0), "--split-at"),
        (
            ChaosOptions(faults=parse_fault_kinds("kill-server-splitting")),
            "kill-server-splitting need a split: add --split-to",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            bad.validate()


# --- the pieces that read a split log ---------------------------------------------------------------


def test_a_new_partition_is_applied_from_its_genesis_and_a_gap_after_it_is_still_caught() -> None:
    callbacks = ChecksumCallbacks(counters=True)
    callbacks.apply_transactions([_genesis(2, 41), _transaction(2, 43, b"x"), _transaction(2, 45, b"z")])
    state = callbacks.sequence(2)
    assert state.mark == 43 and state.count == 2
    assert state.errors == ["partition 2: transaction 45 after 43 (a gap)"]
    # Anything but a genesis at its barrier + 1 does not start a partition's log: a plain
    # transaction, or a genesis at another ID.
    callbacks.apply_transactions([_transaction(3, 10, b"y")])
    assert callbacks.sequence(3).mark == -1 and len(callbacks.sequence(3).errors) == 1
    misplaced = _transaction(1, 42, _genesis(1, 40).get_raw_data(), SPLIT_RECORD_HEADER)  # 42, not 41
    callbacks.apply_transactions([misplaced])
    assert callbacks.sequence(1).mark == -1 and len(callbacks.sequence(1).errors) == 1


def test_the_reader_passes_split_records_over_and_follows_a_key_into_its_new_partition() -> None:
    keys, seed = 4, 3
    reading = LogReading(first_ids={2: 3})
    callbacks = ChecksumCallbacks(LogObserver(reading, seed, "counter", keys), counters=True)
    key = counter_key_for(seed, 0, 0, keys)
    # The key's first two increments in parent 0, the barrier at 2, then its third in child 2.
    barrier = SplitBarrier(epoch=1, count=4, previous_count=2, parent=0).encode()
    callbacks.apply_transactions(
        [
            _transaction(0, 0, counter_payload(0, 0, key, 1)),
            _transaction(0, 1, counter_payload(0, 0, key, 2)),
            _transaction(0, 2, barrier, SPLIT_RECORD_HEADER),
        ]
    )
    callbacks.apply_transactions([_genesis(2, 2), _transaction(2, 4, counter_payload(0, 0, key, 3))])
    assert reading.counter_errors == [] and reading.bad_payloads == []
    assert reading.split_records == [(0, 2), (2, 3)]
    assert callbacks.values == {key: 3}
    # A key whose increment in the new partition read the value from before the parent's last one.
    callbacks.apply_transactions([_transaction(2, 5, counter_payload(0, 0, key, 3))])
    assert reading.counter_errors == [f"(2, 5): key {key} set to 3 by writer 0 #0, after 3"]
    # A record under the split header that does not decode is damaged, not passed over.
    callbacks.apply_transactions([_transaction(0, 3, b'{"v": 1, "kind": "barrier"}', SPLIT_RECORD_HEADER)])
    assert any("does not decode" in bad for bad in reading.bad_payloads)


def test_gap_and_replica_checks_count_a_new_partition_from_its_genesis() -> None:
    reading = LogReading(first_ids={2: 11})
    reading.marks, reading.counts = {0: 10, 2: 20}, {0: 11, 2: 10}
    assert check_gaps({0: 10, 2: 20}, reading).passed
    reading.counts[2] = 9  # one missing
    failed = check_gaps({0: 10, 2: 20}, reading)
    assert not failed.passed and "from 11" in failed.detail
    assert not check_gaps({0: 10, 2: 20}, LogReading(marks={0: 10, 2: 20}, counts={0: 11, 2: 10})).passed


# --- the run ----------------------------------------------------------------------------------------


@pytest.mark.slow  # a chaos run; the demo with a split in the middle runs by default
def test_a_chaos_run_with_a_split_and_its_parents_owner_killed_keeps_every_invariant(tmp_path: Path) -> None:
    """2 -> 4 at half the run, the counter workload on 32 keys: the split completes, every check
    passes on the four partitions, and keys committed on both sides of it (a lost update there
    would fail the counter check)."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=2000,
        seed=5,
        faults=(),
        workload="counter",
        partitions=2,
        split_to=4,
        lock_pool=32,
        work_dir=tmp_path / "chaos",
        keep=True,
    )
    result = run_chaos(options, lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    names = {c.name: c for c in result.checks}
    split = next(c for c in result.checks if c.name.startswith("the log split from 2 to 4 partitions"))
    assert split.passed and "4 partitions writable" in split.detail, report
    assert "killed server-" in report and "its owner, during the handover" in report, report
    assert (
        "2 of them from a split's genesis on"
        in names["no gaps in transaction IDs, nothing applied twice"].detail
    )
    assert names["counter: every increment read its key's latest value (no lost update)"].passed
    assert result.faults == ["at 50%: kill-server-splitting of partition 0 for 3.0s"], report

    # Keys that moved were committed in their parent, then in their new partition.
    where: dict[int, set[int]] = {}
    for path in sorted((tmp_path / "chaos" / "clients").glob("worker-*.json")):
        worker = json.loads(path.read_text())
        for sequence, partition, _ in worker["acked"]:
            key = counter_key_for(5, worker["worker"], sequence, 32)
            where.setdefault(key, set()).add(partition)
    moved = {k for k, parts in where.items() if parts == {k % 2, k % 4} and k % 2 != k % 4}
    assert moved, where
    assert all(parts <= {k % 2, k % 4} for k, parts in where.items()), where

    # Offline, from the storage directories alone (docs/design/spark.md "Offline reads from
    # replica directories"): each new partition starts at the genesis its log begins with.
    directories = [str(d) for d in sorted((tmp_path / "chaos" / "cluster").glob("storage-*"))]
    plans = {plan.partition_id: plan for plan in plan_offline(directories, replicas=3)}
    assert sorted(plans) == [0, 1, 2, 3]
    assert [plans[p].first_transaction_id for p in (0, 1)] == [0, 0]
    for child in (2, 3):
        plan = plans[child]
        first = plan.first_transaction_id
        assert first > 0, plan
        records = list(read_committed(child, first, plan.high_water_mark, plan.source))
        assert records[0].header == SPLIT_RECORD_HEADER and len(records) == plan.high_water_mark - first + 1
        genesis = decode_split_record(bytes(records[0].data))
        assert (
            isinstance(genesis, SplitGenesis) and genesis.barrier == first - 1 and genesis.parent == child - 2
        )
    # Marks that read a new partition from its genesis while its parent stops below its barrier
    # are no consistent cut: refused.
    child = plans[2]
    cut = {0: child.first_transaction_id - 3, 2: child.high_water_mark}
    with pytest.raises(ConfigurationError, match="not a consistent cut of the log across its split"):
        plan_offline(directories, partitions=[0, 2], high_water_marks=cut)
    assert len(plan_offline(directories, partitions=[2], high_water_marks={2: child.high_water_mark})) == 1


def test_the_replica_check_counts_records_from_a_new_partitions_genesis(tmp_path: Path) -> None:
    from waltz.chaos.checks import ReplicaDigest

    digest = ReplicaDigest(segments=(("0.seg", 1, 10),), records=10, stream_crc=1, problems=())
    digests = {2: {"a": digest, "b": digest, "c": digest}}
    assert check_replicas_on_disk(digests, {2: 20}, 3, {2: 11}).passed
    assert not check_replicas_on_disk(digests, {2: 20}, 3).passed
