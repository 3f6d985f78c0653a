"""Run and supervise OS child processes: free ports, polling with a deadline, managed processes.

Every Waltz server and storage node, and the local ZooKeeper, runs as its own OS process
(docs/design/overview.md "Processes and links"). :class:`ManagedProcess` owns one such child: it
starts it in its own process group, sends its output to a log file, and can kill it hard
(``kill -9``), stop it gracefully, freeze and thaw it, and start it again, which is what failover
and crash tests need.
A module-level registry kills every process still running when the interpreter exits, so a
crashed test run never leaves servers behind; and on Linux every child is killed by the kernel
when the interpreter that started it dies, however it dies (``kill -9`` too): see
:func:`spawn_tied`.

:func:`wait_until` is the one way to wait for a condition (never ``time.sleep`` in a loop); it
fails with a message that says what it was waiting for.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Literal, Self, TypeVar, overload

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_delay,
    wait_fixed,
)

from waltz.errors import ConfigurationError, WaltzError
from waltz.private_files import PRIVATE_UMASK, open_private, private_directory

__all__ = [
    "ManagedProcess",
    "ServiceStartError",
    "close_all",
    "free_port",
    "spawn_tied",
    "wait_for_port",
    "wait_until",
]

_LOG = logging.getLogger(__name__)

T = TypeVar("T")

#: How many bytes at the end of a log file :meth:`ManagedProcess.log_tail` reads at most.
_LOG_TAIL_MAX_BYTES = 256 * 1024


class ServiceStartError(WaltzError):
    """A managed service process exited or did not become ready in time.

    The message names the service, what was awaited, and ends with the tail of its log.
    """


#: Ports :func:`free_port` returned in this process, never returned again (guarded by the lock).
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux: ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: ``LOW-HIGH``: the ports :func:`free_port` draws from, instead of 20000 up to the ephemeral range
#: (the ``waltz.testing`` plugin gives each pytest-xdist worker a slice of its own, so that two
#: workers never draw the same port).
PORT_RANGE_ENV = "WALTZ_PORT_RANGE"


def port_range() -> tuple[int, int]:
    """The ports :func:`free_port` draws from, both ends included: ``WALTZ_PORT_RANGE``
    (``LOW-HIGH``) when set, else 20000 up to below the kernel's ephemeral range.

    Raises:
        ConfigurationError: ``WALTZ_PORT_RANGE`` is not ``LOW-HIGH`` with 1024 <= LOW <= HIGH <= 65535.
    """
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return 20000, _ephemeral_low() - 1
    low_text, _, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low, high = 0, -1
    if not 1024 <= low <= high <= 65535:
        raise ConfigurationError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH, ports from 1024 to 65535")
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now.

    Ports are drawn at random below the kernel's ephemeral range (``ip_local_port_range``, from
    20000 up; ``WALTZ_PORT_RANGE`` sets the range, see :func:`port_range`), so that an outgoing
    connection (which gets an ephemeral port) cannot take the port between this call and the
    caller's bind; a candidate is checked by binding it. Another process
    may still take it first; callers that start a server on it should be ready to retry with
    another port. A port is never handed out twice by one process (a cluster asks for a dozen
    ports before it binds any: two equal random draws made a node fail "Failed to bind to address"
    about once per test run). Falls back to a kernel-chosen port when no candidate is free.

    Args:
        host: the address to bind, loopback by default.

    Returns:
        A port number between 1 and 65535.

    Raises:
        ConfigurationError: ``WALTZ_PORT_RANGE`` is malformed (:func:`port_range`).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = port_range()
    with _HANDED_OUT_LOCK:
        if len(_HANDED_OUT) > (high - low) // 2:
            _HANDED_OUT.clear()  # a very long-lived process: start over rather than run dry
        for _ in range(100 if high >= low else 0):
            candidate = random.randint(low, high)
            if candidate in _HANDED_OUT:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, candidate))
                except OSError:
                    continue
            _HANDED_OUT.add(candidate)
            return candidate
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
            _HANDED_OUT.add(port)
            return port


def _is_falsy(value: object) -> bool:
    return not value


@overload
def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    abort_on: tuple[type[BaseException], ...] = (),
) -> Literal[True]: ...


@overload
def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    abort_on: tuple[type[BaseException], ...] = (),
) -> T: ...


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    abort_on: tuple[type[BaseException], ...] = (),
) -> object:
    """Call ``condition`` every ``interval`` seconds until it returns a truthy value.

    An exception raised by ``condition`` counts as "not yet" (a refused connection while a server
    starts, for instance), unless it is one of ``abort_on``, which ends the wait at once and
    propagates. Exceptions that are not :class:`Exception` (``KeyboardInterrupt``) always propagate.

    Args:
        condition: a callable without arguments; falsy results (``None``, ``False``, ``0``, empty
            containers) mean the condition does not hold yet.
        timeout: how long to wait in seconds; the condition is called at least once.
        what: what is awaited, in words, for the error message (e.g. ``"ZooKeeper on port 2181"``).
        interval: the pause between calls in seconds.
        abort_on: exception types that stop the wait immediately instead of being retried.

    Returns:
        The first truthy value ``condition`` returned.

    Raises:
        TimeoutError: ``timed out after {timeout}s waiting for {what}``, followed by the last
            exception the condition raised, if any (which is also chained as ``__cause__``).
    """

    def retryable(exc: BaseException) -> bool:
        return isinstance(exc, Exception) and not isinstance(exc, abort_on)

    retrying = Retrying(
        retry=retry_if_result(_is_falsy) | retry_if_exception(retryable),
        stop=stop_after_delay(timeout),
        wait=wait_fixed(interval),
    )
    try:
        return retrying(condition)
    except RetryError as retry_error:
        message = f"timed out after {timeout}s waiting for {what}"
        last_attempt = retry_error.last_attempt
        if last_attempt.failed:
            last_exception = last_attempt.exception()
            raise TimeoutError(f"{message}; last error: {last_exception!r}") from last_exception
        raise TimeoutError(message) from None


def wait_for_port(host: str, port: int, *, timeout: float, what: str | None = None) -> None:
    """Wait until a TCP server accepts connections on ``host:port``.

    Args:
        host: the server's address.
        port: the server's port.
        timeout: how long to wait in seconds.
        what: what is awaited, for the error message; defaults to ``"a TCP listener on host:port"``.

    Raises:
        TimeoutError: nothing accepted a connection within ``timeout`` seconds.
    """

    def accepts() -> bool:
        with socket.create_connection((host, port), timeout=1.0):
            return True

    wait_until(accepts, timeout=timeout, what=what or f"a TCP listener on {host}:{port}")


# --- the registry of running processes (atexit safety net) ---------------------------------------

_registry_lock = threading.Lock()
_registry: set[ManagedProcess] = set()


#: Seconds :meth:`ManagedProcess.pause` waits for every thread of the group to stop.
PAUSE_TIMEOUT = 10.0

#: Thread states of ``/proc/<pid>/task/<tid>/stat`` that run no code: stopped, traced, zombie, dead.
_NOT_RUNNING_STATES = frozenset("TtZXx")


def group_running_threads(pgid: int) -> int:
    """The number of threads of process group ``pgid`` that are not stopped (Linux ``/proc``).

    A process or thread that exits while it is read counts as stopped.
    """
    running = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) != pgid:  # state, ppid, pgrp, ...
            continue
        for task in (stat.parent / "task").glob("[0-9]*/stat"):
            try:
                state = task.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in _NOT_RUNNING_STATES:
                running += 1
    return running


#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved before any fork (the child only calls it); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent(parent: int) -> Callable[[], None]:
    """The ``preexec_fn`` that has the kernel SIGKILL the child when its parent dies.

    It runs in the child between ``fork`` and ``exec`` (the setting survives ``exec``). Should the
    parent have died before it, the child is already someone else's: it kills itself.
    """
    prctl = _PRCTL
    assert prctl is not None
    option, signum = ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(int(signal.SIGKILL))

    def preexec() -> None:
        prctl(option, signum)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Spawner:
    """The thread that forks every managed process, alive as long as the interpreter.

    The kernel sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the child exits, not the
    process: a server restarted by a thread that ends (a fault injector's, a pool worker's) would
    be killed with that thread. Forking on one daemon thread that never returns ties every child
    to the interpreter's life alone. A child process of the interpreter (``fork``) gets a thread
    of its own on first use.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._work: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()

    def run(self, action: Callable[[], T]) -> T:
        """Run ``action`` on the spawner thread and return its value (or raise its exception)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._work = queue.SimpleQueue()
                work = self._work
                threading.Thread(target=self._serve, args=(work,), name="waltz-spawner", daemon=True).start()
            work = self._work
        done: Future[object] = Future()
        work.put((action, done))
        return done.result()  # type: ignore[return-value]

    @staticmethod
    def _serve(work: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]]) -> None:
        # Not bounded on purpose: the thread must outlive every child it forked, so it serves
        # until the interpreter ends (a daemon thread, it never holds the exit up).
        while True:
            action, done = work.get()
            try:
                done.set_result(action())
            except BaseException as exc:
                done.set_exception(exc)


_SPAWNER = _Spawner()


def spawn_tied(args: Sequence[str], **popen_args: object) -> subprocess.Popen[bytes]:
    """:class:`subprocess.Popen` whose child dies with this interpreter, however it ends.

    On Linux the child is given ``PR_SET_PDEATHSIG`` = SIGKILL, and forked on a thread that lives
    as long as the interpreter (the signal follows the forking thread); elsewhere this is plain
    ``Popen``. ``popen_args`` are :class:`subprocess.Popen`'s, without ``preexec_fn``. A supervisor
    killed with ``kill -9`` (or a terminal closed under it) then leaves no node behind
    (docs/local-cluster.md, "`waltz up`").

    Raises:
        OSError: the program could not be executed.
    """
    if _PRCTL is None:
        return subprocess.Popen(args, **popen_args)  # type: ignore[call-overload, no-any-return]
    preexec = _die_with_parent(os.getpid())
    # preexec_fn is unsafe when it takes a lock another thread held at the fork; this one takes
    # none: a few system calls, through a function resolved before the fork.
    return _SPAWNER.run(
        lambda: subprocess.Popen(args, preexec_fn=preexec, **popen_args)  # type: ignore[call-overload]  # noqa: PLW1509
    )


def _register(process: ManagedProcess) -> None:
    with _registry_lock:
        _registry.add(process)


def _unregister(process: ManagedProcess) -> None:
    with _registry_lock:
        _registry.discard(process)


def close_all() -> int:
    """Close (kill) every :class:`ManagedProcess` this interpreter started and did not close.

    Registered with :mod:`atexit`, so it runs when the interpreter exits normally; tests and
    supervisors should still close their processes themselves. Processes inherited through
    ``fork`` from a parent interpreter are left to that parent.

    Returns:
        The number of processes that were closed.
    """
    with _registry_lock:
        processes = [p for p in _registry if p.owner_pid == os.getpid()]
    for process in processes:
        try:
            process.close()
        except Exception:
            _LOG.exception("could not close %r at exit", process)
    return len(processes)


atexit.register(close_all)


class ManagedProcess:
    """One OS child process in its own process group, with its output in a log file.

    ``start()`` runs ``args`` with :class:`subprocess.Popen` in a new session, so signals reach
    the process and every child it forks (unless they leave the group themselves). On Linux the
    process dies with this interpreter, whichever thread started it (:func:`spawn_tied`). Used as a
    context manager, entering starts the process (unless it is running) and leaving kills it.
    After the process has exited (or been killed), ``start()`` runs it again with the same
    arguments, appending to the same log file.

    The object is safe to use from several threads.

    Args:
        args: the program and its arguments.
        name: a short name for logs and error messages (e.g. ``"storage-1"``).
        log_path: file that receives stdout and stderr (appended to, created ``0600``, parent
            directories created ``0700``); ``None`` discards the output.
        env: the child's complete environment; ``None`` inherits this process's environment.
        cwd: the child's working directory; ``None`` keeps the current one.
        umask: the child's umask; by default ``077``, so that what it creates (a storage node's
            files, ZooKeeper's snapshots and transaction log) only its owner may read
            (docs/design/storage.md, "File modes").
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        name: str,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        umask: int = PRIVATE_UMASK,
    ) -> None:
        if isinstance(args, str) or not args:
            raise ValueError(f"{name}: args must be a non-empty sequence of strings, got {args!r}")
        self._args = tuple(args)
        self._name = name
        self._log_path = Path(log_path) if log_path is not None else None
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._umask = umask
        self._lock = threading.RLock()
        self._popen: subprocess.Popen[bytes] | None = None
        # True from start() until the whole process group has been sent SIGKILL.
        self._group_may_be_alive = False
        self._owner_pid = os.getpid()

    # --- properties -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The short name given at construction."""
        return self._name

    @property
    def args(self) -> tuple[str, ...]:
        """The program and its arguments."""
        return self._args

    @property
    def log_path(self) -> Path | None:
        """The log file, or ``None`` when the output is discarded."""
        return self._log_path

    @property
    def owner_pid(self) -> int:
        """The PID of the interpreter that created this object (the one that cleans it up)."""
        return self._owner_pid

    @property
    def pid(self) -> int | None:
        """The PID (and process group ID) of the latest start, or ``None`` if never started."""
        with self._lock:
            return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code of the latest run, ``None`` while it runs or if it never started.

        A negative value ``-N`` means the process was ended by signal ``N`` (as in
        :attr:`subprocess.Popen.returncode`).
        """
        with self._lock:
            return self._popen.poll() if self._popen is not None else None

    def is_running(self) -> bool:
        """Whether the process was started and has not exited (a paused process is running)."""
        with self._lock:
            return self._popen is not None and self._popen.poll() is None

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process (again, if it ran before).

        Raises:
            RuntimeError: the process is already running.
            OSError: the program could not be executed (e.g. :class:`FileNotFoundError`).
        """
        with self._lock:
            if self.is_running():
                raise RuntimeError(f"{self._name} is already running (pid {self.pid}); kill it first")
            # Leftovers of an earlier run (children of a leader that exited) must not survive.
            self._kill_group()
            log_file = None
            if self._log_path is not None:
                private_directory(self._log_path.parent)
                log_file = os.fdopen(open_private(self._log_path, os.O_WRONLY | os.O_APPEND), "ab")
                log_file.write(
                    f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self._name}: "
                    f"{' '.join(self._args)}\n".encode()
                )
                log_file.flush()
            try:
                self._popen = spawn_tied(
                    self._args,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file if log_file is not None else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd=self._cwd,
                    start_new_session=True,
                    close_fds=True,
                    umask=self._umask,
                )
            finally:
                if log_file is not None:
                    log_file.close()
            self._group_may_be_alive = True
            _register(self)
            _LOG.info("started %s (pid %d): %s", self._name, self._popen.pid, " ".join(self._args))

    def kill(self) -> int | None:
        """Kill the process and its whole process group with SIGKILL (``kill -9``) and reap it.

        Nothing is flushed or shut down cleanly; this is the crash that crash tests need. Works on
        a paused process too. Does nothing harmful if the process has already exited.

        Returns:
            The exit code (``-9`` when the signal ended it), or ``None`` if never started.
        """
        with self._lock:
            if self._popen is None:
                return None
            was_running = self._popen.poll() is None
            self._kill_group()
            returncode = self._popen.wait()
            _unregister(self)
            if was_running:
                _LOG.info("killed %s (pid %d)", self._name, self._popen.pid)
            return returncode

    def terminate(self, timeout: float = 10.0) -> int | None:
        """Stop the process gracefully: SIGTERM, wait, then SIGKILL if it is still alive.

        The process group is sent SIGTERM followed by SIGCONT (so a paused process sees it).
        Members of the group still alive after the leader exited are killed.

        Args:
            timeout: seconds to wait for the process to exit after SIGTERM.

        Returns:
            The exit code, or ``None`` if never started.
        """
        with self._lock:
            if self._popen is None:
                return None
            if self._popen.poll() is None:
                self._signal_group(signal.SIGTERM)
                self._signal_group(signal.SIGCONT)
                try:
                    self._popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    _LOG.warning(
                        "%s (pid %d) did not exit %.1fs after SIGTERM; killing it",
                        self._name,
                        self._popen.pid,
                        timeout,
                    )
                else:
                    _LOG.info("stopped %s (pid %d)", self._name, self._popen.pid)
            return self.kill()

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit on its own.

        Args:
            timeout: seconds to wait.

        Returns:
            The exit code.

        Raises:
            RuntimeError: the process was never started.
            TimeoutError: it is still running after ``timeout`` seconds.
        """
        with self._lock:
            popen = self._popen
        if popen is None:
            raise RuntimeError(f"{self._name} was never started")
        try:
            return popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {self._name} (pid {popen.pid}) to exit"
            ) from None

    def wait_ready(
        self,
        condition: Callable[[], T | None],
        *,
        timeout: float,
        what: str,
        interval: float = 0.05,
    ) -> T:
        """Wait until ``condition`` holds, failing at once if the process exits meanwhile.

        Use it after :meth:`start` to wait for a service to answer (a port, a health check).

        Args:
            condition: as for :func:`wait_until`; exceptions it raises count as "not yet".
            timeout: how long to wait in seconds.
            what: what is awaited, in words, for the error message.
            interval: the pause between calls in seconds.

        Returns:
            The first truthy value ``condition`` returned.

        Raises:
            ServiceStartError: the process exited, was never started, or ``condition`` did not
                hold within ``timeout`` seconds; the message ends with the tail of the log.
        """

        def check() -> T | None:
            if not self.is_running():
                raise ServiceStartError(
                    f"{self._name} exited with code {self.returncode} while waiting for {what}; "
                    f"its log ({self._log_path}) ends with:\n{self.log_tail()}"
                )
            return condition()

        try:
            return wait_until(
                check, timeout=timeout, what=what, interval=interval, abort_on=(ServiceStartError,)
            )
        except TimeoutError as timeout_error:
            raise ServiceStartError(
                f"{self._name} (pid {self.pid}) is running but not ready: {timeout_error}; "
                f"its log ({self._log_path}) ends with:\n{self.log_tail()}"
            ) from timeout_error

    def pause(self, timeout: float = PAUSE_TIMEOUT) -> None:
        """Freeze the process group with SIGSTOP (a "stop the world" pause, e.g. a long GC).

        Returns once every thread of the group is stopped: a signal is only queued by ``kill``,
        and on a loaded machine a JVM's threads can go on serving for a moment after it.

        Args:
            timeout: seconds to wait for every thread to stop.

        Raises:
            RuntimeError: the process is not running.
            TimeoutError: a thread of the group was still running after ``timeout`` seconds.
        """
        with self._lock:
            if not self.is_running():
                raise RuntimeError(f"cannot pause {self._name}: it is not running")
            self._signal_group(signal.SIGSTOP)
            assert self._popen is not None
            pgid = self._popen.pid
            wait_until(
                lambda: group_running_threads(pgid) == 0,
                timeout=timeout,
                what=f"every thread of {self._name} (process group {pgid}) to stop",
            )

    def resume(self) -> None:
        """Let a paused process group continue (SIGCONT). Does nothing if it is not running."""
        with self._lock:
            if self.is_running():
                self._signal_group(signal.SIGCONT)

    def close(self) -> None:
        """Kill the process (if it runs) and everything left in its group. Idempotent."""
        self.kill()

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- diagnostics ------------------------------------------------------------------------------

    def log_tail(self, n_lines: int = 50) -> str:
        """Return the last lines of the log file, for error messages.

        Args:
            n_lines: how many lines at most.

        Returns:
            The lines joined with newlines, or a short note when there is no log to show.
        """
        if self._log_path is None:
            return f"(the output of {self._name} is discarded: no log file)"
        try:
            with self._log_path.open("rb") as log_file:
                size = log_file.seek(0, os.SEEK_END)
                log_file.seek(max(0, size - _LOG_TAIL_MAX_BYTES))
                data = log_file.read()
        except FileNotFoundError:
            return f"(log file {self._log_path} of {self._name} does not exist)"
        lines = data.decode(errors="replace").splitlines()
        return "\n".join(lines[-n_lines:]) if n_lines > 0 else ""

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exited {self.returncode}" if self._popen else "new"
        return f"ManagedProcess(name={self._name!r}, pid={self.pid}, {state})"

    # --- internals --------------------------------------------------------------------------------

    def _signal_group(self, signum: signal.Signals) -> None:
        if self._popen is None or not self._group_may_be_alive:
            return
        with contextlib.suppress(ProcessLookupError):  # the whole group has exited already
            os.killpg(self._popen.pid, signum)

    def _kill_group(self) -> None:
        self._signal_group(signal.SIGKILL)
        self._group_may_be_alive = False
