"""Cancelling an await of the asyncio client ends the wait at once and leaves nothing behind: no
thread still waiting out the timeout, no started client nobody holds (docs/asyncio-service.md,
"Answers in bounded time"; docs/design/client.md "WaltzClient and AsyncWaltzClient").

The first test's client is plaintext against the session's cluster, which requires TLS, so its
partitions never mount: every wait on them would last its whole timeout."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from support import settle

from tests.client.client_helpers import Append, HeldAppend, MemoryStore
from waltz import AsyncWaltzClient, Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import ClientClosedError
from waltz.local.cluster import LocalCluster

#: Far longer than the test: a wait still running after its cancellation would hold the run.
LONG = 600.0


def _run_bounded(main: Callable[[], Awaitable[None]], bound: float) -> None:
    """``asyncio.run(main())`` on a thread, which must end within ``bound`` seconds: closing the
    loop waits for every thread of its default executor, so a wait left running holds it."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(main())  # type: ignore[arg-type]
        except BaseException as error:  # handed to the test's thread
            failure.append(error)

    runner = threading.Thread(target=target, name="cancellation-test", daemon=True)
    started = time.monotonic()
    runner.start()
    runner.join(bound)
    assert not runner.is_alive(), (
        f"asyncio.run had not returned after {time.monotonic() - started:.0f} s: a cancelled wait "
        "still runs on a thread"
    )
    if failure:
        raise failure[0]


def test_cancelled_waits_of_the_async_client_end_at_once_and_leave_no_thread_waiting(
    cluster: LocalCluster, log_start: dict[int, int]
) -> None:
    settings = {k: v for k, v in cluster.client_settings().items() if not k.startswith("client_tls_")}
    config = WaltzClientConfig(**settings)
    waits: dict[str, float] = {}

    async def main() -> None:
        client = await AsyncWaltzClient(MemoryStore(log_start), config).start()
        try:
            never = await client.submit(Append(0, b"never mounted"))  # in flight for good
            calls: dict[str, Callable[[], Coroutine[Any, Any, object]]] = {
                "wait_mounted": lambda: client.wait_mounted(LONG),
                "ready": lambda: client.ready(LONG),
                "get_high_water_mark": lambda: client.get_high_water_mark(0, LONG),
                "flush": lambda: client.flush(None),
            }
            core = client._core
            for name, call in calls.items():
                task = asyncio.create_task(call())
                await asyncio.sleep(0.5)
                assert not task.done(), f"{name} ended on an unmountable partition: {task}"
                assert core.pending_waits == (0 if name == "flush" else 1), name
                task.cancel()
                started = time.monotonic()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 10)
                waits[name] = time.monotonic() - started
                # The wait on the client's core loop ended too, not only the await.
                await settle(lambda: core.pending_waits == 0, f"{name}'s wait on the core loop to end", 5)
            assert not never.done()
            # A close while another task waits ends that wait with ClientClosedError.
            waiting = asyncio.create_task(client.ready(LONG))
            flushing = asyncio.create_task(client.flush(None))
            applying = asyncio.create_task(client.wait_applied(0, log_start[0] + 1, None))
            await asyncio.sleep(0.5)
        finally:
            await client.close()
        for task in (waiting, flushing, applying):
            with pytest.raises(ClientClosedError, match="closed"):
                await asyncio.wait_for(task, 10)
        with pytest.raises(ClientClosedError):
            await never

    _run_bounded(main, 60)
    assert set(waits) == {"wait_mounted", "ready", "get_high_water_mark", "flush"}

    # The blocking client alike: threads waiting for a mount, or for an apply with no time limit,
    # hear of the close at once.
    errors: dict[str, BaseException] = {}
    with WaltzClient(MemoryStore(log_start), config) as client:
        blocking: dict[str, Callable[[], object]] = {
            "wait_mounted": lambda: client.wait_mounted(LONG),
            "ready": lambda: client.ready(LONG),
            "get_high_water_mark": lambda: client.get_high_water_mark(0, LONG),
            "wait_applied": lambda: client.wait_applied(0, log_start[0] + 1, None),
        }

        def wait(name: str) -> None:
            try:
                blocking[name]()
            except BaseException as error:  # handed to the test's thread
                errors[name] = error

        waiters = [threading.Thread(target=wait, args=(n,), name=n, daemon=True) for n in blocking]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.5)
        assert all(w.is_alive() for w in waiters) and not errors
    for waiter in waiters:
        waiter.join(10)
        assert not waiter.is_alive(), f"{waiter.name} still waits after the close"
    assert all(isinstance(e, ClientClosedError) for e in errors.values()) and len(errors) == 4, errors
    assert "closed while waiting for a mount" in str(errors["wait_mounted"])
    assert "closed while waiting until it is ready" in str(errors["ready"])
    assert "closed while asking for a high-water mark" in str(errors["get_high_water_mark"])
    assert "closed before the transaction was applied" in str(errors["wait_applied"])


def test_a_start_cancelled_while_it_connects_closes_the_client_it_was_making(
    cluster: LocalCluster, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    config = WaltzClientConfig(**cluster.client_settings())
    unstarted: list[AsyncWaltzClient] = []
    caplog.set_level(logging.INFO, logger="waltz.client.core")

    async def main() -> None:
        client = AsyncWaltzClient(MemoryStore(log_start), config)
        task = asyncio.create_task(client.start())
        await asyncio.sleep(0)  # the client is being made on a thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        unstarted.append(client)

    _run_bounded(main, 60)
    # The client made for the cancelled start was made all the same, and closed (on a thread of
    # its own when the cancellation came once it was made: waited for here).
    for _ in range(100):  # bounded: 10 s
        said = [r.getMessage() for r in caplog.records if r.name == "waltz.client.core"]
        if any(re.match(r"Waltz client \d+ closed", m) for m in said):
            break
        time.sleep(0.1)
    started = {m.split()[2] for m in said if re.match(r"Waltz client \d+ started", m)}
    closed = {m.split()[2] for m in said if re.match(r"Waltz client \d+ closed", m)}
    assert len(started) == 1, said
    assert closed == started, said
    with pytest.raises(RuntimeError, match="not started"):
        _ = unstarted[0].client_id


def test_concurrent_starts_make_one_client_and_apply_each_transaction_once(
    cluster: LocalCluster, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """``start`` is idempotent also when awaited twice at once (``asyncio.gather``, two requests
    racing to start a shared client): both awaits wait for one start, one ZooKeeper session, one
    client applying to the callbacks. Before, each made a client, the second overwrote the first,
    and the first, never closed, mounted and applied every transaction to the same callbacks a
    second time."""
    config = WaltzClientConfig(**cluster.client_settings())
    store = MemoryStore(log_start)
    caplog.set_level(logging.INFO, logger="waltz.client.core")
    append = Append(0, b"applied once by one client")
    committed: list[int] = []

    async def main() -> None:
        client = AsyncWaltzClient(store, config)
        try:
            first, second = await asyncio.gather(client.start(), client.start())
            assert first is second is client
            outcome = await asyncio.wait_for(client.submit_async(append), 30)
            assert outcome.transaction_id is not None
            committed.append(outcome.transaction_id)
            assert await client.wait_applied(0, committed[0], 30)
        finally:
            await client.close()

    _run_bounded(main, 120)
    said = [r.getMessage() for r in caplog.records if r.name == "waltz.client.core"]
    started = {m.split()[2] for m in said if re.match(r"Waltz client \d+ started", m)}
    closed = {m.split()[2] for m in said if re.match(r"Waltz client \d+ closed", m)}
    assert len(started) == 1, said
    assert closed == started, said
    assert store.calls[0] == committed, "the append was given to apply_transaction more than once"


def test_a_close_while_a_start_is_under_way_leaves_no_client_started(
    cluster: LocalCluster, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """``close`` awaited while ``start`` is still making the client (connecting on its thread)
    waits for that start and closes what it made: every client started is closed when ``close``
    returns. Before, ``close`` found no client yet and returned, and the start then left a client
    started, mounted and applying, that nobody would close."""
    config = WaltzClientConfig(**cluster.client_settings())
    store = MemoryStore(log_start)
    caplog.set_level(logging.INFO, logger="waltz.client.core")

    async def main() -> None:
        client = AsyncWaltzClient(store, config)
        starting = asyncio.create_task(client.start())
        await asyncio.sleep(0)  # the start holds its lock and is making the client on a thread
        await client.close()
        await starting
        said = [r.getMessage() for r in caplog.records if r.name == "waltz.client.core"]
        started = {m.split()[2] for m in said if re.match(r"Waltz client \d+ started", m)}
        closed = {m.split()[2] for m in said if re.match(r"Waltz client \d+ closed", m)}
        assert started and closed == started, said
        await client.close()  # idempotent

    _run_bounded(main, 120)


class _HeldApplyStore(MemoryStore):
    """A :class:`MemoryStore` whose ``apply_transaction`` waits until ``go`` is set: this client's
    commits stay unapplied, so a new context waits to read its own writes."""

    def __init__(self, start: dict[int, int]) -> None:
        super().__init__(start)
        self.go = threading.Event()

    def apply_transaction(self, transaction: Transaction) -> None:
        if not self.go.wait(60):
            raise TimeoutError("the test never let the apply go on")
        super().apply_transaction(transaction)


def _in_flight(client: AsyncWaltzClient, partition_id: int) -> float:
    """The client's ``waltz_client_partition_transactions_in_flight`` of a partition."""
    value = client.metrics.get_sample_value(
        "waltz_client_partition_transactions_in_flight", {"partition": str(partition_id)}
    )
    return -1.0 if value is None else value


def test_a_submission_whose_await_is_cancelled_before_its_first_attempt_runs_goes_on(
    cluster: LocalCluster, log_start: dict[int, int]
) -> None:
    """A request cancelled while its context's first attempt waits for an attempt thread (a busy
    service, a caller that hung up) stops waiting, not the submission: the context commits, its
    slot is freed and ``flush`` returns (before, it stayed in flight for good and ``flush`` never
    returned)."""
    config = WaltzClientConfig(**cluster.client_settings(), client_num_transaction_retry_threads=1)
    store = MemoryStore(log_start)
    go = threading.Event()
    holder = HeldAppend(0, b"holds the only attempt thread", go)
    queued = HeldAppend(0, b"cancelled while its first attempt waits for a thread", go)

    async def main() -> None:
        async with AsyncWaltzClient(store, config) as client:
            await client.wait_mounted(30)
            holding = asyncio.create_task(client.submit_async(holder))
            await settle(holder.entered.is_set, "the first context to hold the only attempt thread", 10)
            waiting = asyncio.create_task(client.submit_async(queued))
            await settle(lambda: _in_flight(client, 0) == 2, "the second context to be in flight", 10)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, 10)
            go.set()
            assert (await asyncio.wait_for(holding, 30)).committed
            await client.flush(20)
            assert _in_flight(client, 0) == 0
            # A future completes once its commit is in the feed, before its apply; closing leaves
            # queued applies, so the client closes once both are applied.
            await settle(lambda: len(store.applied[0]) == 2, "both contexts to be applied", 10)

    _run_bounded(main, 120)
    assert queued.outcomes.completions == [True], queued.outcomes
    assert [a.data for a in store.applied[0]] == [holder.data, queued.data]


def test_a_submission_whose_await_is_cancelled_while_it_waits_to_read_its_writes_goes_on(
    cluster: LocalCluster, log_start: dict[int, int]
) -> None:
    """A request cancelled while its context waits for this client's own earlier commit to be
    applied (read your writes) goes on once it is: it commits, and ``flush`` returns (before, it
    stayed in flight for good)."""
    config = WaltzClientConfig(**cluster.client_settings(), client_read_your_writes_timeout=LONG)
    store = _HeldApplyStore(log_start)
    first = Append(0, b"committed, not yet applied here")
    second = Append(0, b"cancelled while it waits to read the first")

    async def main() -> None:
        async with AsyncWaltzClient(store, config) as client:
            await client.wait_mounted(30)
            assert (await asyncio.wait_for(client.submit_async(first), 30)).committed
            waiting = asyncio.create_task(client.submit_async(second))
            await settle(lambda: _in_flight(client, 0) == 1, "the second context to be in flight", 10)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, 10)
            assert second.outcomes.executions == 0  # it had not run yet: it waited
            store.go.set()
            await client.flush(20)
            assert _in_flight(client, 0) == 0
            # A future completes once its commit is in the feed, before its apply; closing leaves
            # queued applies, so the client closes once both are applied.
            await settle(lambda: len(store.applied[0]) == 2, "both contexts to be applied", 10)

    _run_bounded(main, 120)
    assert second.outcomes.completions == [True], second.outcomes
    assert [a.data for a in store.applied[0]] == [first.data, second.data]
