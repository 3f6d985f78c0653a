"""A context's timeout while its partition cannot be mounted (docs/design/client.md "Retries and
lock failures"): its append waits for the mount unsent, and the timeout ends it there, as expired,
with nothing committed; the client goes on once the partition mounts again."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from tests.client.client_helpers import Append, MemoryStore
from waltz import AsyncWaltzClient, Outcome, WaltzClient, WaltzClientConfig
from waltz.client.mount_procedure import PartitionState
from waltz.errors import TransactionExpiredError
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

TIMEOUT = 30.0
#: Seconds a submit at the concurrency limit is given to end (its context's timeout is 2 s).
BOUND = 8.0


def in_flight(registry: CollectorRegistry, partition_id: int = 0) -> float | None:
    """A client's contexts in flight on a partition, as its metrics say."""
    return registry.get_sample_value(
        "waltz_client_partition_transactions_in_flight", {"partition": str(partition_id)}
    )


class Timed(Append):
    """An append with a timeout that counts its expirations."""

    def __init__(self, data: bytes, timeout: float) -> None:
        super().__init__(0, data)
        self.timeout = timeout
        self.expirations = 0

    def on_expiration(self) -> None:
        self.expirations += 1


def test_a_context_expires_at_its_timeout_while_its_partition_cannot_be_mounted(zookeeper: object) -> None:
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
    ) as cluster:
        store = MemoryStore({0: -1})
        config = WaltzClientConfig(**cluster.client_settings())
        with WaltzClient(store, config) as client:
            first = client.submit(Append(0, b"first")).result(TIMEOUT).transaction_id
            assert first is not None
            assert cluster.stop_server(0) == 0
            # A graceful stop with a client connected ends its stream; gRPC logs no ERROR.
            log_path = cluster.servers[0].process.log_path
            assert log_path is not None
            stop_log = log_path.read_text()
            assert "server stopped" in stop_log
            assert "Exception not handled" not in stop_log and "CancelledError" not in stop_log, stop_log
            wait_until(
                lambda: client.partition_states()[0] is not PartitionState.MOUNTED,
                timeout=TIMEOUT,
                what="the client to see its server gone",
            )
            context = Timed(b"never sent", timeout=1.5)
            started = time.monotonic()
            with pytest.raises(TransactionExpiredError, match="expired after 1 attempt"):
                client.submit(context).result(TIMEOUT)
            waited = time.monotonic() - started
            assert waited < TIMEOUT / 2, f"the timeout did not bound the wait for the mount ({waited:.1f}s)"
            assert context.expirations == 1 and context.outcomes.completions == []
            assert not client.has_pending_transactions()
            cluster.restart_server(0)
            try:
                after = client.submit(Append(0, b"after")).result(TIMEOUT).transaction_id
            except TimeoutError:  # say where it stood: the server's log and the client's partition
                restarted = log_path.read_text()[-4000:]
                raise AssertionError(
                    f"no commit within {TIMEOUT}s of the server's restart; the client's partition is "
                    f"{client.partition_states()[0]}; the server's log ends:\n{restarted}"
                ) from None
            assert after == first + 1, "the expired context's append was committed after all"
            assert client.wait_applied(0, after, TIMEOUT)
            assert [a.data for a in store.applied[0]] == [b"first", b"after"]


@pytest.mark.parametrize("api", ["WaltzClient", "AsyncWaltzClient"])
def test_a_submit_at_the_concurrency_limit_expires_at_its_context_s_timeout(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int], api: str
) -> None:
    """Both servers frozen (SIGSTOP), the partition's two slots held by appends that cannot end: a
    third context with a timeout of 2 s waits for a slot up to its timeout, not until the servers
    come back, and then expires (``on_expiration``, ``TransactionExpiredError``) with nothing
    sent and no slot taken."""
    config = client_config.model_copy(update={"client_max_concurrent_transactions": 2})
    store = MemoryStore(log_start)
    context = Timed(b"no slot", timeout=2.0)
    paused: list[int] = []

    def freeze() -> None:
        for index in range(len(cluster.servers)):
            cluster.pause_server(index)
            paused.append(index)

    def thaw() -> None:
        while paused:
            cluster.resume_server(paused.pop())

    try:
        if api == "WaltzClient":
            with WaltzClient(store, config) as client:
                client.wait_mounted(TIMEOUT)
                freeze()
                held = [client.submit(Append(0, b"held %d" % i)) for i in range(2)]
                submitted: list[concurrent.futures.Future[Outcome]] = []
                started = time.monotonic()
                third = threading.Thread(target=lambda: submitted.append(client.submit(context)), daemon=True)
                third.start()
                third.join(BOUND)
                waited = time.monotonic() - started
                assert not third.is_alive(), f"submit still waits for a slot after {BOUND}s (timeout 2 s)"
                with pytest.raises(TransactionExpiredError, match=r"expired after 0 attempt"):
                    submitted[0].result(TIMEOUT)
                assert in_flight(client.metrics) == 2  # its wait took no slot
                thaw()
                assert all(f.result(TIMEOUT).committed for f in held)
        else:

            async def main() -> float:
                async with AsyncWaltzClient(store, config) as client:
                    await client.wait_mounted(TIMEOUT)
                    freeze()
                    held = [await client.submit(Append(0, b"held %d" % i)) for i in range(2)]
                    started = time.monotonic()
                    try:
                        future = await asyncio.wait_for(client.submit(context), BOUND)
                    except TimeoutError:
                        raise AssertionError(
                            f"submit still waits for a slot after {BOUND}s (timeout 2 s)"
                        ) from None
                    waited = time.monotonic() - started
                    with pytest.raises(TransactionExpiredError, match=r"expired after 0 attempt"):
                        await asyncio.wait_for(future, TIMEOUT)
                    assert in_flight(client.metrics) == 2  # its wait took no slot
                    thaw()
                    outcomes = [await asyncio.wait_for(f, TIMEOUT) for f in held]
                    assert all(outcome.committed for outcome in outcomes)
                    return waited

            waited = asyncio.run(main())
    finally:
        thaw()
    assert waited < 3.0, f"the submit waited {waited:.1f}s for a slot, past its 2 s timeout"
    assert context.expirations == 1 and context.outcomes.executions == 0
