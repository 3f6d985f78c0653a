"""The process's one event loop for gRPC's asyncio layer, on a thread of its own, shared by every
client in the process and by the synchronous tools that call gRPC's asyncio layer.

docs/design/client.md "The client's parts": the client's asyncio core runs on a thread of its own.
gRPC's asyncio layer binds its completion queue to each event loop that ever used it, and an event
loop closed while still bound makes later callbacks fail ("Bad file descriptor", "Event loop is
closed"); one loop that lives as long as the process avoids that, and costs one thread however many
clients the process opens. The loop is started on first use and never stopped (its thread is a
daemon); each client cleans up its own tasks and connections when it closes. The admin tools, the
committed reads, the archiver's and the local cluster's probes run their coroutines on it too
(:func:`run_on_shared_loop`), not on loops of their own that ``asyncio.run`` would open and close.
It stands in ``waltz.protocol`` so that every layer above the wire protocol may use it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_on_shared_loop", "shared_event_loop"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # gRPC wakes every event loop bound to its completion queue; all but one then find nothing to
    # read and raise from PollerCompletionQueue._handle_events (grpc/grpc#25364): harmless noise.
    # At the process's exit gRPC's shutdown, on the main thread, closes the queue's socket and
    # cancels the reader while this loop may be running it: the handle then names no callback
    # ("Exception in callback None()"), and only the traceback says where the error came from.
    exception = context.get("exception")
    if isinstance(exception, OSError) and (
        "PollerCompletionQueue" in repr(context.get("handle")) or _raised_by_grpc_poller(exception)
    ):
        log.debug("ignored a spurious gRPC poller wake-up: %s", exception)
        return
    loop.default_exception_handler(context)


def _raised_by_grpc_poller(exception: BaseException) -> bool:
    """Whether ``exception`` was raised in gRPC's completion queue poller: a frame of its
    traceback is ``PollerCompletionQueue``'s (Cython names the frames of gRPC's compiled code
    ``grpc._cython.cygrpc.<class>.<method>``, in ``.../aio/completion_queue.pyx.pxi``)."""
    frame = exception.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if "PollerCompletionQueue" in code.co_name or code.co_filename.endswith("completion_queue.pyx.pxi"):
            return True
        frame = frame.tb_next
    return False


def _run(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def shared_event_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The process's client event loop and its thread, started on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            _loop = asyncio.new_event_loop()
            _loop.set_exception_handler(_exception_handler)
            _thread = threading.Thread(target=_run, args=(_loop,), name="waltz-client-loop", daemon=True)
            _thread.start()
        return _loop, _thread


def run_on_shared_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the process's shared event loop and return its result (or raise its error);
    the caller's thread waits. For synchronous code that calls gRPC's asyncio layer: a loop of its
    own, closed once the coroutine ends, leaves gRPC's completion queue bound to a closed loop, and
    the events still due to it then fail in whichever loop reads the queue next ("Event loop is
    closed"), delaying that loop's own events (docs/design/client.md, "The client's parts").

    An interrupt of the waiting thread (``KeyboardInterrupt``) cancels the coroutine.

    Raises:
        RuntimeError: called on the shared loop's own thread (it would wait for itself).
    """
    loop, thread = shared_event_loop()
    if threading.current_thread() is thread:
        coro.close()
        raise RuntimeError("run_on_shared_loop called on the shared event loop's own thread")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
