"""The instance processes of a ``waltz perf`` application run (``smallbank``, ``inventory``).

Part of :mod:`waltz.workloads.perf` (its module docstring describes the run). Each process is
started with ``spawn`` on a target ``(spec, start, stop, results)``; it talks to the coordinator
through a queue of ``(kind, index, payload)`` messages (``ready``, ``result``, ``closed``, or
``error``) and waits for the coordinator's ``start`` and ``stop`` events. Every wait is bounded;
:meth:`InstanceProcesses.close` terminates, kills and reaps what is left.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from waltz.jdbc_style import ChangeSetCallbacks

__all__ = ["InstanceProcesses", "PerfRunError", "entity_cache_counts", "run_reporting_errors"]


class PerfRunError(RuntimeError):
    """A ``waltz perf`` application run could not complete: an instance process failed, or a
    phase timed out."""


class InstanceProcesses:
    """The instance processes of a run and their messages; kills and reaps them on :meth:`close`
    (a context manager: ``with InstanceProcesses(...) as processes``).

    Args:
        specs: what each process runs (picklable; ``spec.index`` numbers them from 0).
        target: the process's function, called as ``target(spec, start, stop, results)``; it must
            put an ``("error", index, description)`` message instead of raising.
        name: the processes' name prefix (``<name>-<index>``).
        error: the exception :meth:`gather` raises (a :class:`PerfRunError`).
    """

    def __init__(
        self,
        specs: Sequence[Any],
        target: Callable[[Any, Any, Any, Any], None],
        name: str,
        error: type[PerfRunError] = PerfRunError,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.error = error
        self.start = context.Event()
        self.stop = context.Event()
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=target,
                args=(spec, self.start, self.stop, self.results),
                name=f"{name}-{spec.index}",
                daemon=True,
            )
            for spec in specs
        ]
        try:
            for process in self.processes:
                process.start()
        except BaseException:  # those started are stopped, not left behind
            self.close()
            raise

    def __enter__(self) -> InstanceProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def gather(self, kind: str, timeout: float, what: str) -> dict[int, Any]:
        """One ``kind`` message from every instance, within ``timeout`` seconds.

        Returns:
            Each instance's payload, by index.

        Raises:
            PerfRunError: (``error``) an instance reported an error or died, or the time ran out.
        """
        received: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(received) < len(self.processes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(len(self.processes))) - set(received))
                raise self.error(f"instance(s) {missing}: not {what} within {timeout:g}s")
            try:
                message, index, payload = self.results.get(timeout=min(1.0, remaining))
            except queue.Empty:
                for i, process in enumerate(self.processes):
                    if i not in received and process.exitcode not in (None, 0):
                        code = process.exitcode
                        raise self.error(f"instance {i}: its process exited with code {code}") from None
                continue
            if message == "error":
                raise self.error(f"instance {index} failed: {payload}")
            if message != kind:
                raise self.error(f"instance {index}: expected {kind!r}, got {message!r}")
            received[index] = payload
        return received

    def close(self) -> None:
        """Let stopped processes end (10 s at most), then terminate, kill and reap the rest."""
        stopping = self.stop.is_set()  # else an error or Ctrl-C: no use waiting
        self.stop.set()
        deadline = time.monotonic() + (10.0 if stopping else 0.5)
        started = [process for process in self.processes if process.pid is not None]
        for process in started:
            process.join(max(0.1, deadline - time.monotonic()))
        for process in started:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        self.results.close()
        self.results.cancel_join_thread()


def entity_cache_counts(callbacks: ChangeSetCallbacks) -> tuple[int, int]:
    """An instance's entity cache hits and misses so far ((0, 0) when it has none)."""
    cache = callbacks.entity_cache
    return (0, 0) if cache is None else (cache.hits, cache.misses)


def run_reporting_errors(
    run: Callable[[Any, Any, Any, Any], None], spec: Any, start: Any, stop: Any, results: Any
) -> None:
    """The body of an instance process's target: ``run(spec, start, stop, results)``, with an
    ``("error", spec.index, description)`` message on ``results`` instead of an exception. Ctrl-C
    reaches the whole process group and is ignored here: the coordinator stops the instances."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run(spec, start, stop, results)
    except BaseException as exc:
        results.put(("error", spec.index, f"{type(exc).__name__}: {exc}"))
