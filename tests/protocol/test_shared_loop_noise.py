"""The shared event loop drops gRPC's poller noise and nothing else (waltz/protocol/event_loop.py;
docs/design/client.md "The client's parts")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from waltz.protocol.event_loop import _exception_handler

#: Where Cython says gRPC's compiled poller code is, as its tracebacks name it.
_POLLER_FILE = "src/python/grpcio/grpc/_cython/_cygrpc/aio/completion_queue.pyx.pxi"
_POLLER_METHOD = "grpc._cython.cygrpc.PollerCompletionQueue._handle_events"


def _raised_in(filename: str, name: str) -> OSError:
    """An ``EBADF`` whose traceback has a frame of ``name`` in ``filename``, as the poller's does
    when gRPC's shutdown closed its socket."""
    namespace: dict[str, object] = {}
    exec(compile("def handle():\n    raise OSError(9, 'Bad file descriptor')\n", filename, "exec"), namespace)
    handle = namespace["handle"]
    assert callable(handle)
    handle.__code__ = handle.__code__.replace(co_name=name)
    try:
        handle()
    except OSError as exc:
        return exc
    raise AssertionError("not raised")


def _logged(exception: BaseException, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the shared loop's handler logs of ``exception`` raised by a reader's handle that was
    cancelled while it ran: such a handle names no callback ("Exception in callback None()")."""
    loop = asyncio.new_event_loop()
    try:
        callback: Callable[[], None] = lambda: None  # noqa: E731
        handle = asyncio.Handle(callback, (), loop)
        handle.cancel()
        context = {"message": "Exception in callback None()", "exception": exception, "handle": handle}
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            _exception_handler(loop, context)
        return [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "asyncio"]
    finally:
        loop.close()


def test_the_poller_s_bad_file_descriptor_at_exit_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    assert _logged(_raised_in(_POLLER_FILE, _POLLER_METHOD), caplog) == []
    # Named by its file alone, or by its method alone, it is the poller's too.
    assert _logged(_raised_in(_POLLER_FILE, "_handle_events"), caplog) == []
    assert _logged(_raised_in("<elsewhere>", _POLLER_METHOD), caplog) == []


def test_any_other_error_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    reported = ["Exception in callback None()"]
    assert _logged(_raised_in("src/app/reader.py", "read_socket"), caplog) == reported
    # Not an OSError, though raised in the poller: reported.
    poller_bug = ValueError("unexpected")
    poller_bug.__traceback__ = _raised_in(_POLLER_FILE, _POLLER_METHOD).__traceback__
    assert _logged(poller_bug, caplog) == reported
