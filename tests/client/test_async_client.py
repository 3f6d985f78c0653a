"""The asyncio twin of the client (AsyncWaltzClient) against the local cluster."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import settle

from tests.client.client_helpers import Append, BreakableStore, HeldAppend, Increment, MemoryStore
from waltz import AsyncWaltzClient, PartitionLocalLock, TransactionBuilder, WaltzClientConfig
from waltz.client.exit_hook import EXIT_WAIT
from waltz.client.mount_procedure import PartitionState
from waltz.errors import AsyncCallbackError, WaltzTimeoutError
from waltz.local.cluster import LocalCluster


def test_async_round_trip_and_the_write_lock_race(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)

    async def main() -> None:
        async with (
            AsyncWaltzClient(store, client_config) as first,
            AsyncWaltzClient(store, client_config) as second,
        ):
            assert first.client_id != second.client_id
            contexts = [Append(i % 2, b"async %d" % i) for i in range(100)]
            ids = await asyncio.gather(
                *(client.submit_async(c) for client, c in zip([first, second] * 50, contexts, strict=True))
            )
            assert all(outcome.committed for outcome in ids)
            await first.flush(10)
            assert not first.has_pending_transactions()
            marks = {pid: await first.get_high_water_mark(pid) for pid in (0, 1)}
            for client in (first, second):
                for pid, mark in marks.items():
                    assert await client.wait_applied(pid, mark, 30)

            # Same WRITE lock, same high-water mark, both in flight at once: exactly one commits.
            lock = PartitionLocalLock("async race", 1)
            for round_number in range(20):
                mark = store.get_client_high_water_mark(0)
                racers = [Append(0, b"r%d" % round_number, write_lock=lock, high_water_mark=mark, once=True)
                          for _ in range(2)]  # fmt: skip
                results = await asyncio.gather(first.submit_async(racers[0]), second.submit_async(racers[1]))
                committed = [r.transaction_id for r in results if r.committed]
                assert len(committed) == 1, f"round {round_number}: {results}"
                assert racers[[r.dropped for r in results].index(True)].outcomes.lock_failures == 1
                assert await first.wait_applied(0, committed[0], 30)

    asyncio.run(main())
    assert store.errors == []
    for pid, applied in store.applied.items():
        assert [a.transaction_id for a in applied] == list(
            range(log_start[pid] + 1, applied[-1].transaction_id + 1)
        )


def test_async_stale_increments_lose_no_update(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    stores = [MemoryStore(log_start), MemoryStore(log_start)]
    lock = PartitionLocalLock("async counter", 1)

    async def main() -> list[Increment]:
        async with (
            AsyncWaltzClient(stores[0], client_config) as first,
            AsyncWaltzClient(stores[1], client_config) as second,
        ):
            contexts = [Increment(stores[i % 2], 1, lock) for i in range(100)]
            futures = [await (first if i % 2 == 0 else second).submit(c) for i, c in enumerate(contexts)]
            await asyncio.gather(*futures)
            mark = await first.get_high_water_mark(1)
            for client in (first, second):
                assert await client.wait_applied(1, mark, 30)
            return contexts

    contexts = asyncio.run(main())
    assert all(c.outcomes.completions == [True] for c in contexts)
    assert sum(c.outcomes.lock_failures for c in contexts) > 0, "the race never happened"
    assert stores[0].values[1] == stores[1].values[1] == 100


def test_a_first_attempt_held_back_by_a_retry_thread_stuck_in_an_attempt_is_named_in_a_warning(
    cluster: LocalCluster, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt that waits on its retry thread for something that needs that thread (another
    transaction's outcome, from an entity context's ``run``) held every later attempt back with no
    word; the client now warns, naming the context that waits, what holds the threads and for how
    long, and the likely cause (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""
    config = WaltzClientConfig(
        **cluster.client_settings(), client_num_transaction_retry_threads=1, client_long_wait_threshold=0.5
    )
    store = MemoryStore(log_start)
    go = threading.Event()
    holder = HeldAppend(0, b"holds the only retry thread", go)
    held_back = HeldAppend(1, b"waits for the retry thread", go)
    caplog.set_level(logging.WARNING, logger="waltz.client.attempt_runner")

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "retry threads" in r.getMessage()]

    async def main() -> None:
        async with AsyncWaltzClient(store, config) as client:
            await client.wait_mounted(30)
            holding = asyncio.create_task(client.submit_async(holder))
            await settle(holder.entered.is_set, "the first context to hold the only retry thread", 10)
            waiting = asyncio.create_task(client.submit_async(held_back))
            await settle(lambda: bool(warned()), "a warning that the retry thread is held", 10)
            go.set()
            assert (await asyncio.wait_for(holding, 30)).committed
            assert (await asyncio.wait_for(waiting, 30)).committed

    asyncio.run(main())
    [message] = warned()
    assert message.startswith("HeldAppend on partition 1: its first attempt has waited 0.5s"), message
    assert (
        "1 retry threads (client.numTransactionRetryThreads), busy with: HeldAppend (partition 0) for"
        in message
    )
    assert "waits there for another transaction's outcome waits for ever" in message


class _SlowCompletion(Append):
    """An :class:`Append` whose ``on_completion`` blocks until ``go`` is set (a call to another
    service made there)."""

    def __init__(self, partition: int, data: bytes, go: threading.Event) -> None:
        super().__init__(partition, data)
        self.go = go
        self.completing = threading.Event()

    def on_completion(self, result: bool) -> None:
        self.completing.set()
        if not self.go.wait(60):
            raise TimeoutError("the test never let the completion go on")
        super().on_completion(result)


def test_a_completion_callback_that_holds_the_completion_thread_is_named_in_a_warning(
    cluster: LocalCluster, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """An ``on_completion`` that blocks held back every later outcome of the client with no word;
    the client now warns, naming the contexts whose completions run and for how long
    (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""
    config = WaltzClientConfig(**cluster.client_settings(), client_long_wait_threshold=0.5)
    store = MemoryStore(log_start)
    go = threading.Event()
    slow = _SlowCompletion(0, b"its completion blocks", go)
    caplog.set_level(logging.WARNING, logger="waltz.client.attempt_runner")

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "completion thread" in r.getMessage()]

    async def main() -> None:
        async with AsyncWaltzClient(store, config) as client:
            await client.wait_mounted(30)
            slowly = asyncio.create_task(client.submit_async(slow))
            await settle(slow.completing.is_set, "the slow completion to start", 10)
            # Nothing else commits: the warning does not wait for a later outcome to come.
            await settle(lambda: bool(warned()), "a warning that the completion thread is held", 10)
            behind = asyncio.create_task(client.submit_async(Append(1, b"its outcome waits behind")))
            await settle(
                lambda: any(a.data == b"its outcome waits behind" for a in store.applied[1]),
                "the later transaction to be applied",
                10,
            )
            assert not behind.done()
            go.set()
            assert (await asyncio.wait_for(slowly, 30)).committed
            assert (await asyncio.wait_for(behind, 30)).committed

    asyncio.run(main())
    [message] = warned()
    assert message.startswith("the client's completion thread has run the completions of 1 context(s) of "
                              "_SlowCompletion for "), message  # fmt: skip
    assert "keep them short" in message


#: A program that submits contexts it never awaits and returns without closing its client.
_FORGETS_TO_CLOSE = """
import asyncio, json, logging, sys
from tests.client.client_helpers import Append, MemoryStore
from waltz import AsyncWaltzClient, WaltzClientConfig
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
start = {int(pid): mark for pid, mark in json.loads(sys.argv[1]).items()}
async def main():
    client = await AsyncWaltzClient(MemoryStore(start), WaltzClientConfig()).start()
    for n in range(20):
        asyncio.ensure_future(client.submit_async(Append(n % 2, b"never awaited")))
    await asyncio.sleep(0)
asyncio.run(main())
"""


@pytest.mark.parametrize("mounted", [True, False], ids=["mounted", "never-mounted"])
def test_a_client_not_closed_at_exit_is_closed_with_a_warning_after_its_transactions_end(
    cluster: LocalCluster, log_start: dict[int, int], mounted: bool
) -> None:
    """A program that forgot to close its client exited with its transactions in flight dropped
    without a word, and its client went on reading from the servers while Python's thread pools
    refused work (a traceback per batch of messages). The client is now closed as the interpreter
    begins to exit: its transactions in flight get ``EXIT_WAIT`` seconds to end, and a warning
    says how many did not (docs/design/client.md "WaltzClient and AsyncWaltzClient")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    env.update(cluster.client_env())
    if not mounted:  # plaintext against a cluster that requires TLS: its partitions never mount
        env = {k: v for k, v in env.items() if not k.startswith("WALTZ_CLIENT_TLS_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    ran = subprocess.run(
        [sys.executable, "-c", _FORGETS_TO_CLOSE, json.dumps(log_start)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_WAIT + 60,
    )
    assert ran.returncode == 0, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "was not closed" in line]
    assert len(warnings) == 1, ran.stderr
    if mounted:
        assert "waited for its 20 transaction(s) in flight to end, and closing it now" in warnings[0]
        assert "Traceback" not in ran.stderr, ran.stderr
    else:
        assert "20 of its 20 transaction(s) in flight had not ended 10s later" in warnings[0]
    assert "Close a client once its submissions have ended" in warnings[0]


class _AsyncAppend(Append):
    """:class:`Append` written ``async def execute``: a coroutine the client would never run."""

    async def execute(self, builder: TransactionBuilder) -> bool:  # type: ignore[override]
        return super().execute(builder)


def test_an_async_def_execute_is_refused_naming_it(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """A context written ``async def execute`` returned a coroutine, which counted as True: an
    empty transaction was appended and answered committed. It now fails with
    ``AsyncCallbackError`` naming ``execute``; nothing is appended."""
    store = MemoryStore(log_start)

    async def main() -> None:
        async with AsyncWaltzClient(store, client_config) as client:
            with pytest.raises(AsyncCallbackError, match=r"_AsyncAppend\.execute returned coroutine"):
                await asyncio.wait_for(client.submit_async(_AsyncAppend(0, b"never built")), 30)
            after = await client.submit_async(Append(0, b"built"))
            assert after.committed and after.transaction_id == log_start[0] + 1  # nothing before it
            await client.wait_applied(0, after.transaction_id, 30)

    asyncio.run(main())
    assert [a.data for a in store.applied[0]] == [b"built"]


def test_the_async_client_answers_the_inspections_that_ready_s_timeout_points_to(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """``ready()``'s timeout says to see ``unhealthy_partitions()``: the asyncio client has it, and
    the other in-memory inspections of ``WaltzClient`` (docs/design/client.md "WaltzClient and
    AsyncWaltzClient"). Before, they were missing (``AttributeError``)."""
    store = BreakableStore(log_start)

    async def main() -> None:
        client = AsyncWaltzClient(store, client_config)
        assert client.config is client_config  # before the start too
        async with client:
            await client.wait_mounted(30)
            assert client.mounted_partitions() == [0, 1]
            assert client.partition_states() == {0: PartitionState.MOUNTED, 1: PartitionState.MOUNTED}
            assert client.unhealthy_partitions() == {} and client.held_partitions() == {}
            store.broken.set()
            assert (await asyncio.wait_for(client.submit_async(Append(0, b"fails to apply")), 30)).committed
            with pytest.raises(WaltzTimeoutError, match=r"see unhealthy_partitions\(\)"):
                await client.ready(1)
            unhealthy = client.unhealthy_partitions()
            assert list(unhealthy) == [0] and "broken on purpose" in str(unhealthy[0]), unhealthy
            store.broken.clear()
            await client.ready(30)
            assert client.unhealthy_partitions() == {}

    asyncio.run(main())
