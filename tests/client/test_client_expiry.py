"""A context's timeout while its partition cannot be mounted (docs/design/client.md "Retries and
lock failures"): its append waits for the mount unsent, and the timeout ends it there, as expired,
with nothing committed; the client goes on once the partition mounts again."""

from __future__ import annotations

import time

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.client.mount_procedure import PartitionState
from waltz.errors import TransactionExpiredError
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

TIMEOUT = 30.0


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
