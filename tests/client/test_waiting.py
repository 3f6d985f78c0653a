"""The concurrency limit and the applied-mark watermark, from threads and from coroutines."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from support import settle

from waltz.client.waiting import ConcurrencyLimit, Watermark
from waltz.local.processes import wait_until


def test_limit_blocks_at_the_limit_and_hands_over_in_order() -> None:
    limit = ConcurrencyLimit(2)
    assert limit.acquire(0) and limit.try_acquire()
    assert not limit.try_acquire()
    assert not limit.acquire(0.05)  # timed out: no slot taken
    order: list[int] = []

    def waiter(i: int) -> None:
        assert limit.acquire(10)
        order.append(i)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(2)]
    for queued, t in enumerate(threads, start=1):
        t.start()  # queue them in a known order
        wait_until(lambda: len(limit._waiters) == queued, timeout=10, what=f"{queued} waiter(s)")  # noqa: B023
    limit.release()
    wait_until(lambda: order == [0], timeout=10, what="the first waiter to get the slot")
    limit.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1]
    assert limit.in_use == 2
    limit.release()
    limit.release()
    assert limit.in_use == 0
    with pytest.raises(RuntimeError, match="released more often"):
        limit.release()


def test_limit_from_coroutines() -> None:
    async def main() -> None:
        limit = ConcurrencyLimit(1)
        assert await limit.acquire_async()
        assert not await limit.acquire_async(0.05)
        waiting = asyncio.ensure_future(limit.acquire_async(10))
        await asyncio.sleep(0.01)
        threading.Thread(target=limit.release).start()  # released from another thread
        assert await waiting
        cancelled = asyncio.ensure_future(limit.acquire_async())
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        limit.release()
        assert limit.in_use == 0  # the cancelled waiter took nothing

    asyncio.run(main())


def test_watermark_wakes_threads_and_coroutines() -> None:
    mark = Watermark(5)
    assert mark.wait(5, 0)
    assert not mark.wait(6, 0.02)
    woken = threading.Event()

    def waiter() -> None:
        if mark.wait(8, 10):
            woken.set()

    thread = threading.Thread(target=waiter)
    thread.start()

    async def main() -> None:
        assert not await mark.wait_async(9, 0.02)
        waiting = asyncio.ensure_future(mark.wait_async(9, 10))
        await asyncio.sleep(0.01)
        await asyncio.to_thread(mark.advance, 7)
        assert not waiting.done() and not woken.is_set()
        await asyncio.to_thread(mark.advance, 9)
        assert await waiting

    asyncio.run(main())
    thread.join(10)
    assert woken.is_set()
    mark.advance(3)  # never goes back
    assert mark.value == 9


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the callbacks other threads schedule on it."""

    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[no-untyped-def]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def test_watermark_wakes_the_coroutines_of_one_loop_with_one_callback() -> None:
    mark = Watermark(0)
    loop = CountingLoop()

    async def main() -> list[bool]:
        waiting = [asyncio.ensure_future(mark.wait_async(target, 10)) for target in (1, 2, 2, 3, 5)]
        await asyncio.sleep(0)  # one turn of the loop: each waiter has registered
        before = loop.threadsafe_calls
        await asyncio.get_running_loop().run_in_executor(None, mark.advance, 3)
        woken = await asyncio.gather(*waiting[:4])
        assert not waiting[4].done()
        # one callback for the four waiters (the executor's own hand-back is one more)
        assert loop.threadsafe_calls - before == 2
        await asyncio.to_thread(mark.advance, 5)
        return [*woken, await waiting[4]]

    try:
        assert loop.run_until_complete(main()) == [True] * 5
    finally:
        loop.close()


def test_call_when_calls_now_or_on_the_thread_that_advances_the_mark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mark = Watermark(5)
    calls: list[tuple[str, str]] = []

    def recorder(name: str) -> Callable[[], None]:
        return lambda: calls.append((name, threading.current_thread().name))

    mark.call_when(5, recorder("reached"))  # already there: at once, on this thread
    assert calls == [("reached", threading.current_thread().name)]
    mark.call_when(8, recorder("eight"))
    mark.call_when(7, recorder("seven"))

    def boom() -> None:
        raise RuntimeError("callback failed")

    mark.call_when(7, boom)
    mark.advance(6)
    assert len(calls) == 1  # neither target reached
    thread = threading.Thread(target=mark.advance, args=(7,), name="advancer")
    thread.start()
    thread.join(10)
    assert calls[1:] == [("seven", "advancer")]  # the other waiter's exception was logged, not raised
    assert "callback failed" in caplog.text
    mark.advance(10)
    assert calls[2:] == [("eight", threading.current_thread().name)]
    mark.advance(11)
    assert len(calls) == 3  # each callback once


def test_a_closed_watermark_ends_the_waits_below_it_with_the_close_s_error() -> None:
    mark = Watermark(5)
    errors: list[BaseException] = []
    called: list[int] = []

    def wait() -> None:
        try:
            mark.wait(10, None)
        except RuntimeError as error:
            errors.append(error)

    async def wait_async() -> None:
        with pytest.raises(RuntimeError, match="closed"):
            await mark.wait_async(10, None)

    async def scenario() -> None:
        waiter = threading.Thread(target=wait)
        waiter.start()
        task = asyncio.create_task(wait_async())
        mark.call_when(10, lambda: called.append(10))
        await settle(lambda: len(mark._waiters) == 3, "three waiters", 5)
        mark.close(lambda: RuntimeError("closed"))
        await asyncio.wait_for(task, 5)
        await asyncio.to_thread(waiter.join, 5)
        assert not waiter.is_alive() and len(errors) == 1

    asyncio.run(scenario())
    assert called == []  # dropped, never called
    assert mark.wait(5, 0) and mark.wait(3, None)  # reached before the close: still True
    with pytest.raises(RuntimeError, match="closed"):
        mark.wait(6, 0)  # and any later wait above it raises at once
    mark.advance(10)  # a late advance is taken, and reached targets hold
    assert mark.wait(10, None)
    mark.close(lambda: ValueError("second close"))  # idempotent: the first error stays
    with pytest.raises(RuntimeError):
        mark.wait(11, 0)
