"""What the two node processes (storage nodes, servers) share: their entry point and run loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import typer

from waltz.tuning import grpc_experiments_in_effect, grpc_fork_support_in_effect, tune_garbage_collector

__all__ = [
    "STOP_BOUND",
    "STOP_TIMEOUT_EXIT_CODE",
    "Service",
    "call_in_daemon_thread",
    "run_command",
    "run_until_signalled",
    "tune_garbage_collector",
]

log = logging.getLogger(__name__)

#: Seconds a node process may take to exit after SIGTERM or SIGINT, in every ZooKeeper state
#: (docs/design/server.md, "Stopping within a bound"). Past it, the process exits at once.
STOP_BOUND = 10.0

#: The exit status of a process that did not stop gracefully within :data:`STOP_BOUND`.
STOP_TIMEOUT_EXIT_CODE = 75

T = TypeVar("T")


class Service(Protocol):
    """A long-running service with an asynchronous life cycle."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def call_in_daemon_thread(function: Callable[[], T], timeout: float, what: str) -> T | None:
    """Run a blocking call on a daemon thread of its own; wait for it at most ``timeout`` seconds.

    Unlike ``asyncio.to_thread``, a call that never returns (a kazoo call waiting for a ZooKeeper
    that is gone) holds neither the event loop's shutdown nor the interpreter's exit: both wait
    for the default executor's threads, never for a daemon thread.

    Args:
        function: the call, without arguments.
        timeout: seconds to wait for it.
        what: what the call does, for the warning when it does not end in time.

    Returns:
        The call's result, or None when it did not end within ``timeout`` (it goes on in the
        background; a warning says so).

    Raises:
        Exception: whatever the call raised.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = function()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=target, name=what, daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        log.warning("%s did not end within %.1fs; going on without it", what, timeout)
        return None


def _exit_unless_stopped(service: Service, bound: float) -> None:
    """The last resort of :func:`run_until_signalled`: the graceful stop took longer than
    ``bound`` seconds, so the process exits now (status :data:`STOP_TIMEOUT_EXIT_CODE`)."""
    log.error(
        "%s did not stop within %gs of the signal: exiting now (status %d); threads still running: %s",
        type(service).__name__,
        bound,
        STOP_TIMEOUT_EXIT_CODE,
        ", ".join(sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())),
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # exiting anyway: the line above is what matters
            handler.flush()
    sys.stderr.flush()
    os._exit(STOP_TIMEOUT_EXIT_CODE)


def run_until_signalled(service: Service, stop_bound: float = STOP_BOUND) -> None:
    """Start ``service``, run until SIGTERM or SIGINT, then stop it gracefully.

    The process exits within ``stop_bound`` seconds of the signal whatever the stop waits for
    (docs/design/server.md, "Stopping within a bound"): past it, it logs the threads still running
    and exits with status :data:`STOP_TIMEOUT_EXIT_CODE`.

    Args:
        service: what to run.
        stop_bound: seconds from the signal to the process's exit, at most.
    """
    watchdog = threading.Timer(stop_bound, _exit_unless_stopped, args=(service, stop_bound))
    watchdog.name = "stop-watchdog"
    watchdog.daemon = True

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def signalled() -> None:
            if not watchdog.is_alive():
                watchdog.start()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signalled)
        log.info(
            "gRPC core experiments: %s; fork support: %s",
            grpc_experiments_in_effect(),
            grpc_fork_support_in_effect(),
        )
        try:
            await service.start()
        except BaseException:
            # Release what the start opened (ports, files) before the error is reported.
            try:
                await service.stop()
            except Exception:
                log.exception("could not stop what a failed start had opened")
            raise
        tune_garbage_collector()
        try:
            await stop.wait()
            log.info("stopping on signal")
        finally:
            await service.stop()

    # The watchdog, once started, watches until the process ends: the interpreter's exit joins the
    # default executor's threads, and one may still wait for a call that never returns.
    asyncio.run(serve())


def run_command(command: Callable[..., None], argv: Sequence[str], prog_name: str) -> None:
    """Run a node's start command alone as a program (``python -m``), with ``argv``.

    The same function is ``waltz storage start`` or ``waltz server start`` in the ``waltz``
    command; alone it starts without importing every other command (the SQL framework, alembic,
    Spark's helpers): the process starts in a third of the time. Exits with the command's status.
    """
    app = typer.Typer(add_completion=False, rich_markup_mode="markdown")
    app.command()(command)
    typer.main.get_command(app).main(args=list(argv), prog_name=prog_name)
