"""The client's Prometheus metrics (``WaltzClient.metrics``) against the local cluster."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from tests.client.client_helpers import Append, BreakableStore, MemoryStore
from waltz import AsyncWaltzClient, PartitionLocalLock, Transaction, WaltzClient, WaltzClientConfig
from waltz.local.processes import wait_until


def sample(registry: CollectorRegistry, name: str, partition: int | None = None) -> float:
    """A sample's value; fails (rather than returning None) when the sample does not exist."""
    labels = {} if partition is None else {"partition": str(partition)}
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


def test_counters_and_gauges_after_commits_and_a_lock_failure(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    lock = PartitionLocalLock("metrics", 1)
    with WaltzClient(store, client_config) as client:
        registry = client.metrics
        for pid in (0, 1):  # every partition's counters exist from the start, at 0
            assert sample(registry, "waltz_client_transactions_submitted_total", pid) == 0
        futures = [client.submit(Append(i % 2, b"metrics %d" % i)) for i in range(7)]
        assert all(f.result(30).committed for f in futures)
        locked = client.submit(Append(0, b"locked", write_lock=lock)).result(30).transaction_id
        assert locked is not None
        stale = Append(0, b"stale", write_lock=lock, high_water_mark=locked - 1, once=True)
        assert client.submit(stale).result(30).dropped
        assert stale.outcomes.lock_failures == 1
        client.flush(10)
        marks = {pid: client.get_high_water_mark(pid) for pid in (0, 1)}
        for pid, mark in marks.items():
            assert client.wait_applied(pid, mark, 30)

        # Partition 0: 4 appends, the locked one and the stale one; partition 1: 3 appends.
        assert sample(registry, "waltz_client_transactions_submitted_total", 0) == 6
        assert sample(registry, "waltz_client_transactions_submitted_total", 1) == 3
        assert sample(registry, "waltz_client_transactions_committed_total", 0) == 5
        assert sample(registry, "waltz_client_transactions_committed_total", 1) == 3
        assert sample(registry, "waltz_client_lock_failures_total", 0) == 1
        assert sample(registry, "waltz_client_lock_failures_total", 1) == 0
        for pid in (0, 1):
            assert sample(registry, "waltz_client_failed_appends_total", pid) == 0
            assert sample(registry, "waltz_client_apply_errors_total", pid) == 0
            assert sample(registry, "waltz_client_remounts_total", pid) == 0
            # This client applied everything written since the test began (only its own).
            assert (
                sample(registry, "waltz_client_transactions_applied_total", pid)
                == marks[pid] - log_start[pid]
            )
            assert sample(registry, "waltz_client_partition_transactions_in_flight", pid) == 0
            assert sample(registry, "waltz_client_partition_client_high_water_mark", pid) == marks[pid]
            assert sample(registry, "waltz_client_partition_server_high_water_mark", pid) == marks[pid]
            assert sample(registry, "waltz_client_partition_mounted", pid) == 1
            assert sample(registry, "waltz_client_partition_unhealthy", pid) == 0
        assert sample(registry, "waltz_client_commit_seconds_count") == 8
        assert 0 < sample(registry, "waltz_client_commit_seconds_sum") < 8 * 30
        # The client's own delays: 9 appends sent (the stale context's retry dropped itself before
        # sending), 8 commits completed (the last batch's total is added once its loop ends).
        assert sample(registry, "waltz_client_append_queue_seconds_count") == 9
        assert 0 < sample(registry, "waltz_client_append_queue_seconds_sum") < 9 * 30
        # Each context's first attempt sent an append (the stale one's too, which the server
        # refused); each of the 8 commits ended a log round trip within its submit-to-commit time.
        assert sample(registry, "waltz_client_first_attempt_seconds_count") == 9
        assert 0 < sample(registry, "waltz_client_first_attempt_seconds_sum") < 9 * 30
        assert sample(registry, "waltz_client_log_round_trip_seconds_count") == 8
        round_trips = sample(registry, "waltz_client_log_round_trip_seconds_sum")
        assert 0 < round_trips <= sample(registry, "waltz_client_commit_seconds_sum")
        wait_until(
            lambda: sample(registry, "waltz_client_completion_delay_seconds_count") == 8,
            timeout=10,
            what="the completion delays of the 8 commits",
        )
        assert 0 < sample(registry, "waltz_client_completion_delay_seconds_sum") < 8 * 30
    assert store.errors == []


class SlowStore(MemoryStore):
    """A memory store whose ``apply_transaction`` takes at least ``APPLY_SECONDS``."""

    APPLY_SECONDS = 0.1

    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(self.APPLY_SECONDS)
        super().apply_transaction(transaction)


def test_apply_stages_time_the_wait_behind_earlier_applies_and_each_apply(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = SlowStore(log_start)
    with WaltzClient(store, client_config) as client:
        registry = client.metrics
        assert sample(registry, "waltz_client_apply_wait_seconds_count") == 0
        assert sample(registry, "waltz_client_apply_seconds_count") == 0
        # Four appends to one partition, in flight together: they commit within a few
        # milliseconds of one another, and each apply takes 100 ms, so the later ones wait.
        futures = [client.submit(Append(0, b"slow %d" % i)) for i in range(4)]
        last = max(f.result(30).transaction_id or -1 for f in futures)
        assert client.wait_applied(0, last, 30)
        applied = last - log_start[0]
        assert applied == 4  # the test's own, nothing else was written to partition 0
        wait_until(
            lambda: sample(registry, "waltz_client_apply_seconds_count") == applied,
            timeout=10,
            what="the apply stages of the 4 applies",
        )
        assert sample(registry, "waltz_client_apply_wait_seconds_count") == applied
        applying = sample(registry, "waltz_client_apply_seconds_sum")
        assert SlowStore.APPLY_SECONDS * applied <= applying < 30
        # Once the first apply began, the other three were queued behind it: if all four were
        # there at once they waited 1, 2 and 3 applies; a later commit waits less, but at most a
        # few milliseconds less (they were in flight together), so at least 1 + 2 applies in all.
        waiting = sample(registry, "waltz_client_apply_wait_seconds_sum")
        assert 2.5 * SlowStore.APPLY_SECONDS <= waiting < 30
    assert store.errors == []


def test_apply_errors_unhealthy_and_remounts(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = BreakableStore(log_start)
    with WaltzClient(store, client_config) as client:
        registry = client.metrics
        client.wait_mounted(30)
        store.broken.set()
        transaction_id = client.submit(Append(1, b"not applied yet")).result(30).transaction_id
        assert transaction_id is not None
        wait_until(
            lambda: sample(registry, "waltz_client_partition_unhealthy", 1) == 1,
            timeout=30,
            what="partition 1 to be reported unhealthy while apply_transaction raises",
        )
        assert sample(registry, "waltz_client_apply_errors_total", 1) >= 1
        assert sample(registry, "waltz_client_partition_client_high_water_mark", 1) < transaction_id
        store.broken.clear()
        assert client.wait_applied(1, transaction_id, 30)
        assert sample(registry, "waltz_client_partition_unhealthy", 1) == 0
        assert sample(registry, "waltz_client_transactions_applied_total", 1) == transaction_id - log_start[1]

        client._core.drop_connections("metrics test")
        wait_until(
            lambda: all(sample(registry, "waltz_client_remounts_total", pid) >= 1 for pid in (0, 1)),
            timeout=30,
            what="both partitions to count a remount after their connections dropped",
        )
        client.wait_mounted(30)
        assert all(sample(registry, "waltz_client_partition_mounted", pid) == 1 for pid in (0, 1))


def test_async_client_metrics_exist_before_start(client_config: WaltzClientConfig) -> None:
    client = AsyncWaltzClient(MemoryStore({0: -1, 1: -1}), client_config)
    registry = client.metrics
    assert isinstance(registry, CollectorRegistry)
    # Not started: no partitions yet, so no per-partition samples, but the histogram is there.
    assert registry.get_sample_value("waltz_client_partition_mounted", {"partition": "0"}) is None
    assert sample(registry, "waltz_client_commit_seconds_count") == 0
