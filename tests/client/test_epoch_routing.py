"""The client routes by the partition epochs and runs a context refused for its epoch again
(docs/design/splits.md "Clients across a split", "The routing rule").

Real storage and server processes and a real ZooKeeper, a cluster of 2 partitions per module or
test (a split cannot be undone once a parent is sealing). The test writes ``partitions/epochs`` as
a split's steps do: it prepares epoch 1 (4 partitions) and marks parent 0 sealing; parent 0's
owner then appends its barrier and writes ``B(0)``. The contexts route a key by ``hash mod count``
(a divisible function): hash 4 maps to partition 0 at 4 partitions, hash 1 to 1 (whose parent 1
is not sealing), hash 2 to the new partition 2 (not open: nothing opens children yet).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from kazoo.client import KazooClient

from tests.client.client_helpers import MemoryStore
from tests.services.server.test_epoch_refusals import start_cluster
from waltz import (
    AsyncWaltzClient,
    PartitionLocalLock,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz.client.outcome import Outcome, OutcomeKind
from waltz.errors import TransactionExpiredError
from waltz.local.cluster import LocalCluster
from waltz.metadata.epochs import PartitionEpochs, PartitionEpochsZk
from waltz.metadata.paths import ClusterPaths

#: Reads of the znode at most, 0.1 s apart, while waiting for parent 0's owner to write ``B(0)``.
BARRIER_POLLS = 300
#: Contexts on one lock routed by epoch 0 before the mark, refused after it.
ON_ONE_LOCK = 4


class Keyed(TransactionContext):
    """Appends ``data`` under a key whose partition is ``key_hash mod count``.

    With a ``gate``, its first execution waits for the gate (after setting ``entered``), so that
    the test can mark a parent sealing between its routing and its append.
    """

    def __init__(
        self,
        key_hash: int,
        data: bytes,
        *,
        gate: threading.Event | None = None,
        lock: PartitionLocalLock | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(timeout=timeout)
        self.key_hash = key_hash
        self.data = data
        self.gate = gate
        self.lock = lock
        self.entered = threading.Event()
        self.counts: list[int] = []
        self.executions = 0
        self.completions: list[bool] = []
        self.exceptions: list[BaseException] = []
        self.store: MemoryStore | None = None

    def partition_id(self, num_partitions: int) -> int:
        self.counts.append(num_partitions)
        return self.key_hash % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        self.executions += 1
        if self.gate is not None and self.executions == 1:
            self.entered.set()
            assert self.gate.wait(60), "the test never opened the gate"
        builder.set_raw_data(self.data)
        if self.lock is not None:
            builder.set_write_locks([self.lock])
        return True

    def on_completion(self, result: bool) -> None:
        self.completions.append(result)

    def on_exception(self, exception: BaseException) -> None:
        self.exceptions.append(exception)


def seal_partition_0(cluster: LocalCluster, *, wait_for_barrier: bool = True) -> PartitionEpochs:
    """Prepare epoch 1 (2 -> 4 partitions), mark parent 0 sealing, and (``wait_for_barrier``)
    wait until its owner wrote ``B(0)``: its gate is closed then (docs/design/splits.md "The
    owner's barrier")."""
    zk = KazooClient(hosts=cluster.zookeeper_connect_string)
    zk.start(30)
    try:
        epochs = PartitionEpochsZk(zk, ClusterPaths.of(cluster.root), timeout=30)
        epochs.prepare(4, {0: -1, 1: -1})
        marked = epochs.mark_sealing(1, 0).value
        if not wait_for_barrier:
            return marked
        for _ in range(BARRIER_POLLS):
            value = epochs.read().value
            if value.epoch(1).parents[0].barrier is not None:
                return value
            time.sleep(0.1)
        raise AssertionError(f"parent 0's owner wrote no barrier in {BARRIER_POLLS} reads: {value}")
    finally:
        zk.stop()
        zk.close()


def client_config(cluster: LocalCluster) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings(), zookeeper_session_timeout=10.0)


def start_store(cluster: LocalCluster) -> MemoryStore:
    return MemoryStore({pid: found.high_water_mark for pid, found in cluster.wait_ready(60).items()})


def committed_in(future: Future[Outcome], partition_id: int) -> int:
    outcome = future.result(60)
    assert (outcome.kind, outcome.partition_id) == (OutcomeKind.COMMITTED, partition_id), outcome
    assert outcome.transaction_id is not None
    return outcome.transaction_id


def applied_once(
    client: WaltzClient, store: MemoryStore, partition_id: int, transaction_id: int, data: bytes
) -> None:
    """This client applied ``transaction_id``, and ``data`` is in the partition's log once."""
    assert client.wait_applied(partition_id, transaction_id, 60)
    with store.lock:
        found = [a.transaction_id for a in store.applied[partition_id] if a.data == data]
    assert found == [transaction_id], found


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """A cluster whose parent 0 is sealing for epoch 1 (2 -> 4 partitions) before any client
    starts."""
    with start_cluster(tmp_path_factory.mktemp("epoch-routing-sealed"), zookeeper) as local:
        local.wait_ready(60)
        seal_partition_0(local, wait_for_barrier=False)  # its owner seals it at once
        yield local


def test_a_client_routes_by_the_sealing_parent_and_the_epoch_before_for_the_others(
    sealed: LocalCluster,
) -> None:
    store = start_store(sealed)
    with WaltzClient(store, client_config(sealed)) as client:
        view = client._core.routing.view
        assert (view.epoch, view.count) == (1, 4)
        # Hash 4 is partition 0 at 4: its parent 0 is sealing, so epoch 1; the owner takes it.
        moved_epoch = Keyed(4, b"partition 0, routed by epoch 1")
        first = committed_in(client.submit(moved_epoch), 0)
        # Hash 1 is partition 1 at 4, whose parent 1 is not sealing: epoch 0, partition 1.
        stays = Keyed(1, b"partition 1, routed by epoch 0")
        second = committed_in(client.submit(stays), 1)
        applied_once(client, store, 0, first, moved_epoch.data)
        applied_once(client, store, 1, second, stays.data)
    assert moved_epoch.counts == [4] and stays.counts == [4]
    assert moved_epoch.executions == 1 and stays.executions == 1  # none was refused first


def test_a_context_routed_to_a_new_partition_not_open_waits_instead_of_failing(sealed: LocalCluster) -> None:
    store = start_store(sealed)
    with WaltzClient(store, client_config(sealed)) as client:
        # Hash 2 is partition 2 at 4, a new child of parent 0: not open, so the context waits for
        # the epochs to move, up to its own timeout, and expires without running.
        waits = Keyed(2, b"for partition 2", timeout=1.0)
        future = client.submit(waits)
        with pytest.raises(TransactionExpiredError):
            future.result(60)
        # A context of the sealing parent goes on meanwhile.
        committed_in(client.submit(Keyed(0, b"partition 0 meanwhile")), 0)
    assert waits.executions == 0 and not waits.completions
    assert waits.counts == [4]


def test_the_asyncio_client_routes_by_the_epochs_too(sealed: LocalCluster) -> None:
    store = start_store(sealed)

    async def scenario() -> tuple[Outcome, BaseException | None]:
        async with AsyncWaltzClient(store, client_config(sealed)) as client:
            outcome = await client.submit_async(Keyed(12, b"asyncio, partition 0, epoch 1"))
            try:
                await client.submit_async(Keyed(6, b"asyncio, for partition 2", timeout=1.0))
            except TransactionExpiredError as expired:
                return outcome, expired
            return outcome, None

    outcome, expired = asyncio.run(scenario())
    assert (outcome.kind, outcome.partition_id) == (OutcomeKind.COMMITTED, 0)
    assert isinstance(expired, TransactionExpiredError)


def test_the_client_follows_the_epochs_by_watch_and_runs_refused_contexts_again(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: object
) -> None:
    with start_cluster(tmp_path_factory.mktemp("epoch-routing-watch"), zookeeper) as cluster:
        store = start_store(cluster)
        with WaltzClient(store, client_config(cluster)) as client:
            # No znode: the count of discovery and epoch 0, as before splits.
            view = client._core.routing.view
            assert (view.epoch, view.count, view.version) == (0, 2, -1)
            before = Keyed(3, b"before the split")
            committed_in(client.submit(before), 1)
            assert before.counts == [2]

            # Contexts routed by epoch 0 to partition 0, held in their first execution while the
            # split is marked: one without locks, and several on one lock.
            gate = threading.Event()
            lock = PartitionLocalLock("hot", 1)
            held = [Keyed(4, b"held, no lock", gate=gate)]
            held += [
                Keyed(4 * (i + 2), f"held on the lock {i}".encode(), gate=gate, lock=lock)
                for i in range(ON_ONE_LOCK)
            ]
            futures: dict[int, Future[Outcome]] = {}

            def submit(index: int) -> None:
                futures[index] = client.submit(held[index])

            threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(held))]
            for thread in threads:
                thread.start()
            for context in held:
                assert context.entered.wait(60)
            sealed = seal_partition_0(cluster)  # the owner's gate is closed now
            assert sealed.epoch(1).parents[0].sealing
            gate.set()
            for thread in threads:
                thread.join(60)

            # Each was refused for epoch 0, routed again by epoch 1 (the client read the mark by
            # its watch, without a restart) and committed once in partition 0, on the same future.
            ids = [committed_in(futures[i], 0) for i in range(len(held))]
            assert len(set(ids)) == len(held)
            for context, transaction_id in zip(held, ids, strict=True):
                assert context.counts[0] == 2 and context.counts[-1] == 4, context.counts
                assert context.executions >= 2, context.executions
                assert context.completions == [True] and not context.exceptions
                applied_once(client, store, 0, transaction_id, context.data)
            view = client._core.routing.view
            assert view.epoch == 1 and view.epochs.epoch(1).parents[0].sealing

            # From now on a context of parent 0 goes by epoch 1 at once.
            after = Keyed(8, b"after the split")
            applied_once(client, store, 0, committed_in(client.submit(after), 0), after.data)
            assert after.executions == 1 and after.counts == [4]
