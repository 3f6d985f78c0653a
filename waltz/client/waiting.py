"""Thread-safe waiting primitives usable from plain threads and from any event loop.

:class:`ConcurrencyLimit` bounds the contexts in flight per partition (docs/design/client.md "Back pressure");
:class:`Watermark` is a monotonic mark (a partition's applied high-water mark) that threads and
coroutines wait on. Both are advanced from client threads and woken across threads and loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["ConcurrencyLimit", "Watermark", "wake_on_their_loops"]

log = logging.getLogger(__name__)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        _wake(future)


def wake_on_their_loops(waiters: Iterable[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    """Resolve each future (with None, unless done) on its own event loop, from any thread: one
    callback per loop, whatever the number of its futures; a loop that has closed is skipped
    (nobody waits there any more)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for loop, future in waiters:
        by_loop.setdefault(loop, []).append(future)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop closed
            loop.call_soon_threadsafe(_wake_all, futures)


@dataclass(eq=False, slots=True)
class _SlotWaiter:
    event: threading.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    granted: bool = False

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
        elif self.loop is not None and self.future is not None:
            with contextlib.suppress(RuntimeError):  # the waiter's loop closed
                self.loop.call_soon_threadsafe(_wake, self.future)


class ConcurrencyLimit:
    """A counting limit with FIFO hand-over, for threads and coroutines alike.

    Args:
        limit: how many holders at most.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"limit {limit} must be positive")
        self.limit = limit
        self._lock = threading.Lock()
        self._in_use = 0
        self._waiters: deque[_SlotWaiter] = deque()

    @property
    def in_use(self) -> int:
        """Slots held right now."""
        return self._in_use

    def try_acquire(self) -> bool:
        """Take a slot if one is free (and nobody waits); never blocks."""
        with self._lock:
            if self._in_use < self.limit and not self._waiters:
                self._in_use += 1
                return True
            return False

    def acquire(self, timeout: float | None = None) -> bool:
        """Take a slot, waiting at most ``timeout`` seconds (None: forever).

        Returns:
            True when a slot was taken, False on timeout.
        """
        with self._lock:
            if self._in_use < self.limit and not self._waiters:
                self._in_use += 1
                return True
            waiter = _SlotWaiter(event=threading.Event())
            self._waiters.append(waiter)
        assert waiter.event is not None
        waiter.event.wait(timeout)
        with self._lock:
            if waiter.granted:
                return True
            self._waiters.remove(waiter)
            return False

    async def acquire_async(self, timeout: float | None = None) -> bool:
        """Take a slot from a coroutine, waiting at most ``timeout`` seconds (None: forever).

        Returns:
            True when a slot was taken, False on timeout. Cancellation gives no slot.
        """
        with self._lock:
            if self._in_use < self.limit and not self._waiters:
                self._in_use += 1
                return True
            loop = asyncio.get_running_loop()
            waiter = _SlotWaiter(loop=loop, future=loop.create_future())
            self._waiters.append(waiter)
        assert waiter.future is not None
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with self._lock:
                if not waiter.granted:
                    self._waiters.remove(waiter)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return False
            if isinstance(exc, asyncio.CancelledError):
                self.release()  # granted while being cancelled: pass it on
                raise
        return True

    def release(self) -> None:
        """Give a slot back (to the longest waiter, if any)."""
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.granted = True  # the slot passes on; in_use is unchanged
                waiter.wake()
                return
            if self._in_use <= 0:
                raise RuntimeError("ConcurrencyLimit released more often than acquired")
            self._in_use -= 1


@dataclass(eq=False, slots=True)
class _MarkWaiter:
    target: int
    event: threading.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    callback: Callable[[], None] | None = None
    done: bool = field(default=False)


class Watermark:
    """A monotonic integer mark; threads and coroutines wait until it reaches a target.

    Args:
        value: the initial mark.
    """

    def __init__(self, value: int = -1) -> None:
        self._lock = threading.Lock()
        self._value = value
        self._waiters: list[_MarkWaiter] = []
        self._closed: Callable[[], BaseException] | None = None

    @property
    def value(self) -> int:
        """The current mark."""
        return self._value

    def advance(self, value: int) -> None:
        """Raise the mark to ``value`` (lower values are ignored) and wake whoever it satisfies.

        Coroutines waiting on the same event loop are woken by one callback on that loop (one
        wake-up of the loop, whatever their number: the retries waiting for the same apply batch).
        """
        with self._lock:
            if value <= self._value:
                return
            self._value = value
            if not self._waiters:
                return
            ready = [w for w in self._waiters if w.target <= value]
            if not ready:
                return
            self._waiters = [w for w in self._waiters if w.target > value]
        futures = []
        for waiter in ready:
            waiter.done = True
            if waiter.event is not None:
                waiter.event.set()
            elif waiter.callback is not None:
                try:
                    waiter.callback()
                except Exception:
                    log.exception("a callback waiting for mark %d raised", waiter.target)
            elif waiter.loop is not None and waiter.future is not None:
                futures.append((waiter.loop, waiter.future))
        wake_on_their_loops(futures)

    def close(self, error: Callable[[], BaseException]) -> None:
        """Nothing will advance the mark any more (its client closed): every thread and coroutine
        waiting for a target above it raises ``error()`` now, and so does every later wait for
        one; ``call_when`` callbacks still waiting are dropped, never called. Idempotent."""
        with self._lock:
            if self._closed is not None:
                return
            self._closed = error
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if waiter.event is not None:
                waiter.event.set()
        wake_on_their_loops(
            (w.loop, w.future) for w in waiters if w.loop is not None and w.future is not None
        )

    def _reached(self, target: int) -> bool:
        """Whether the mark is at ``target``; raises the close's error when it is not and never
        will be."""
        if self._value >= target:
            return True
        if self._closed is not None:
            raise self._closed()
        return False

    def call_when(self, target: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the mark is at least ``target``: now (on this thread) when it is
        already, else on the thread that advances the mark that far, right after it does.

        No task, future or event-loop wake-up: what a lock failure's re-attempt waits with. The
        callback must be quick and must not raise (an exception is logged). There is no timeout
        and no cancel: a callback that is no longer wanted must check that itself. Once the mark is
        closed (:meth:`close`), a callback for a target above it is dropped.
        """
        with self._lock:
            if self._value < target:
                if self._closed is None:  # once closed, nothing will call it: dropped
                    self._waiters.append(_MarkWaiter(target, callback=callback))
                return
        callback()

    def wait(self, target: int, timeout: float | None = None) -> bool:
        """Block until the mark is at least ``target``; False after ``timeout`` seconds.

        Raises:
            BaseException: the error :meth:`close` was given, once closed below ``target``.
        """
        with self._lock:
            if self._reached(target):
                return True
            waiter = _MarkWaiter(target, event=threading.Event())
            self._waiters.append(waiter)
        assert waiter.event is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        woken = waiter.event.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not woken:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self._reached(target)

    async def wait_async(self, target: int, timeout: float | None = None) -> bool:
        """Wait from a coroutine until the mark is at least ``target``; False after ``timeout``.

        Raises:
            BaseException: the error :meth:`close` was given, once closed below ``target``.
        """
        with self._lock:
            if self._reached(target):
                return True
            loop = asyncio.get_running_loop()
            waiter = _MarkWaiter(target, loop=loop, future=loop.create_future())
            self._waiters.append(waiter)
        assert waiter.future is not None
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self._reached(target)
