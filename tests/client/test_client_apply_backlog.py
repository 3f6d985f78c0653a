"""Apply flow control (``client.maxApplyBacklog``, ``docs/protocol.md`` "Feed window") on a cluster.

An application that applies more slowly than the log grows must not make its client hold the feed
without bound: the client mounts with a feed window of L transactions beyond what it applied and
grants more as it applies. These tests hold an application's applies behind a gate (a stalled
database), check that at most L transactions wait for it, then open the gate and check that every
transaction is applied exactly once, in order, and that every own submission completes.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import Outcome, Transaction, WaltzClient, WaltzClientConfig
from waltz.client.mount_procedure import PartitionState
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

TIMEOUT = 60.0
LIMIT = 40


class GatedStore(MemoryStore):
    """A :class:`MemoryStore` whose applies wait until the gate opens (a stalled database).

    It records the largest apply backlog its client reported at any apply (``peak``).
    """

    def __init__(self, start: dict[int, int]) -> None:
        super().__init__(start)
        self.gate = threading.Event()
        self.client: WaltzClient | None = None
        self.peak = 0

    def apply_transaction(self, transaction: Transaction) -> None:
        if not self.gate.wait(TIMEOUT):
            raise TimeoutError("the test never opened the gate")
        if self.client is not None:
            self.peak = max(self.peak, *self.client.apply_backlogs().values())
        super().apply_transaction(transaction)


def metric(client: WaltzClient, name: str, partition: int) -> float:
    value = client.metrics.get_sample_value(name, {"partition": str(partition)})
    return 0.0 if value is None else value


def slow_config(config: WaltzClientConfig) -> WaltzClientConfig:
    return config.model_copy(
        update={"client_max_apply_backlog": LIMIT, "client_read_your_writes_timeout": 0.0}
    )


def write(writer: WaltzClient, count: int, prefix: str) -> int:
    """Commit ``count`` transactions on partition 0 through ``writer``; returns the last ID."""
    futures = [writer.submit(Append(0, f"{prefix} {i}".encode(), header=i)) for i in range(count)]
    ids = [f.result(TIMEOUT).transaction_id for f in futures]
    assert all(i is not None for i in ids)
    return max(i for i in ids if i is not None)


def wait_parked(client: WaltzClient, store: GatedStore) -> None:
    """Wait until the gated client holds a full window, then check that nothing more comes."""
    wait_until(
        lambda: client.apply_backlogs().get(0, 0) >= LIMIT,
        timeout=TIMEOUT,
        what=f"the gated client to hold a full feed window of {LIMIT} (at {client.apply_backlogs()})",
    )
    # The server parks the feed at the window end: a second later still exactly one window waits.
    with pytest.raises(TimeoutError):
        wait_until(lambda: client.apply_backlogs()[0] > LIMIT, timeout=1.0, what="more than a window")
    assert client.apply_backlogs()[0] == LIMIT
    assert store.calls[0] == [], "the gate leaked"


def check_applied_once_in_order(store: GatedStore, start: int, last: int) -> None:
    wait_until(
        lambda: store.get_client_high_water_mark(0) >= last,
        timeout=TIMEOUT,
        what=f"the gated client to apply up to {last} (at {store.marks}, errors {store.errors})",
    )
    assert store.errors == []
    assert [a.transaction_id for a in store.applied[0]] == list(range(start + 1, last + 1))
    assert len(store.calls[0]) == len(set(store.calls[0])), "a transaction was handed over twice"
    # A remount while a full window waits may grant one more (the mount's window is never empty).
    assert store.peak <= LIMIT + 1, f"{store.peak} transactions waited for the application (window {LIMIT})"


def test_a_stalled_application_holds_one_window_and_slows_its_own_writers(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    slow = GatedStore(log_start)
    with (
        WaltzClient(slow, slow_config(client_config)) as client,
        WaltzClient(MemoryStore(log_start), client_config) as writer,
    ):
        slow.client = client
        client.wait_mounted(TIMEOUT)
        # 100 of another client's transactions (more than a window), then the gated client's own 30
        # interleaved with 300 more, all on partition 0.
        write(writer, 100, "first")
        own = [Append(0, f"own {i}".encode(), header=i) for i in range(30)]
        own_futures: list[Future[Outcome]] = []
        writer_futures = []
        for i in range(300):
            writer_futures.append(writer.submit(Append(0, f"other {i}".encode(), header=1000 + i)))
            if i % 10 == 0:
                own_futures.append(client.submit(own[len(own_futures)]))
        last_other = max(f.result(TIMEOUT).transaction_id or -1 for f in writer_futures)
        wait_parked(client, slow)
        # Its own commits are beyond the window, not in its feed yet: its submissions still wait.
        assert not any(f.done() for f in own_futures), "the feed went past the window"

        slow.gate.set()
        ids = [f.result(TIMEOUT).transaction_id for f in own_futures]
        assert all(i is not None for i in ids)
        check_applied_once_in_order(slow, log_start[0], max(last_other, *(i for i in ids if i is not None)))
        assert [a.data for a in slow.applied[0] if a.client_id == client.client_id] == [
            f"own {i}".encode() for i in range(30)
        ]
        wait_until(
            lambda: all(c.outcomes.applications == 1 for c in own),
            timeout=TIMEOUT,
            what="on_application once for each of the gated client's own transactions",
        )
        assert all(c.outcomes.completions == [True] for c in own)
        # One grant per half window applied, give or take the batches it was applied in.
        grants = metric(client, "waltz_client_feed_windows_total", 0)
        assert grants >= (430 // (LIMIT // 2)) - 2, grants  # 430 = 100 + 300 + 30 transactions


def test_a_client_far_behind_is_fed_as_fast_as_it_applies(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """A client mounting 300 transactions behind: the mount completes as it applies, one window at
    a time (with a gate closed at first, the mount waits)."""
    with WaltzClient(MemoryStore(log_start), client_config) as writer:
        last = write(writer, 300, "backlog")
        behind = GatedStore(log_start)
        with WaltzClient(behind, slow_config(client_config)) as client:
            behind.client = client
            wait_parked(client, behind)
            # The mount answers once the feed reached the high-water mark: not while parked.
            assert client.partition_states()[0] is PartitionState.MOUNTING
            behind.gate.set()
            client.wait_mounted(TIMEOUT)
            check_applied_once_in_order(behind, log_start[0], last)
            own = client.submit(Append(0, b"after the catch-up"))
            mine = own.result(TIMEOUT).transaction_id
            assert mine is not None and mine > last
            check_applied_once_in_order(behind, log_start[0], mine)


def test_a_parked_client_mounts_again_elsewhere_and_loses_nothing(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """kill -9 of the owner while the gated client's feed is parked: the remount on the new owner
    carries a window of its own, and every transaction is still applied once, in order."""
    slow = GatedStore(log_start)
    with (
        WaltzClient(slow, slow_config(client_config)) as client,
        WaltzClient(MemoryStore(log_start), client_config) as writer,
    ):
        slow.client = client
        client.wait_mounted(TIMEOUT)
        last = write(writer, 200, "before")
        wait_parked(client, slow)
        cluster.kill_server(cluster.owner_index(0))
        cluster.wait_ready(TIMEOUT)
        last = max(last, write(writer, 100, "after"))
        slow.gate.set()
        check_applied_once_in_order(slow, log_start[0], last)


class AbsorbingGatedStore(GatedStore):
    """A :class:`GatedStore` that absorbs what it is about to apply (as the entity cache does)."""

    @property
    def absorbs_transactions(self) -> bool:
        return True

    def absorb_transactions(self, transactions: object) -> None:
        return None


class AbsorbedAppend(Append):
    """An :class:`Append` whose attempts read absorbed state (``reads_absorbed_state``)."""

    reads_absorbed_state = True


def test_a_first_attempt_that_reads_absorbed_state_waits_for_its_own_commit_absorbed_not_applied(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Read your writes waits on the mark the context reads (docs/design/client.md, "From submit
    to the outcome"): absorbed for a context that reads absorbed state, applied otherwise."""
    store = AbsorbingGatedStore(log_start)
    config = client_config.model_copy(update={"client_read_your_writes_timeout": 30.0})
    with WaltzClient(store, config) as client:
        client.wait_mounted(TIMEOUT)
        first = client.submit(Append(0, b"own first")).result(TIMEOUT)
        assert first.transaction_id is not None
        # The commit is absorbed (fed) but not applied: the gate holds the apply.
        submitter = threading.Thread(
            target=lambda: results.append(client.submit(AbsorbedAppend(0, b"reads absorbed")).result(TIMEOUT))
        )
        results: list[Outcome] = []
        submitter.start()
        submitter.join(TIMEOUT / 2)
        assert results and results[0].committed, "the first attempt waited for the apply"
        assert store.get_client_high_water_mark(0) < first.transaction_id, "the gate leaked"
        plain: list[Outcome] = []
        waiting = threading.Thread(
            target=lambda: plain.append(client.submit(Append(0, b"reads applied")).result(TIMEOUT))
        )
        waiting.start()
        waiting.join(2.0)
        assert plain == [], "a context reading applied state ran before its own commit was applied"
        store.gate.set()
        waiting.join(TIMEOUT)
        assert plain and plain[0].committed
