"""Fault test: client connections cut at random points while two clients append.

Like upstream's network-fault test: the cut can land anywhere (an append sent and not received, a
commit whose feed entry is lost with the connection, a mount in progress); every client runs the
reconnect procedure of seed 002 each time. Invariants: every transaction committed exactly once,
both clients apply the same sequence, each context completes once.
"""

from __future__ import annotations

import random
import threading

import pytest
from client_helpers import Append, MemoryStore

from waltz import WaltzClient, WaltzClientConfig


def run_with_cuts(client_config: WaltzClientConfig, log_start: dict[int, int], per_client: int) -> None:
    stores = [MemoryStore(log_start), MemoryStore(log_start)]
    rng = random.Random(20261122)
    with WaltzClient(stores[0], client_config) as first, WaltzClient(stores[1], client_config) as second:
        clients = [first, second]
        submitted: list[tuple[Append, object]] = []
        done = threading.Event()
        cuts = 0

        def cutter() -> None:
            nonlocal cuts
            while not done.wait(rng.uniform(0.01, 0.08)):
                rng.choice(clients)._core.drop_connections("cut by the fault test")
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
                    if local.random() < 0.02:
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
            ids = [future.result(120) for _, future in submitted]  # type: ignore[attr-defined]
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


def test_random_connection_cuts_during_1000_transactions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    run_with_cuts(client_config, log_start, per_client=500)


@pytest.mark.slow
def test_random_connection_cuts_during_5000_transactions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    run_with_cuts(client_config, log_start, per_client=2500)
