"""The chaos run's client processes, as the coordinator sees them: start, listen, wait, stop.

See docs/chaos.md "What runs". Each client process runs :func:`waltz.chaos.worker.worker_main` (spawned:
gRPC and kazoo do not survive a fork) and reports on a pipe (``ready``, ``progress``,
``submitted``, ``done`` or ``error``; see :mod:`waltz.chaos.worker`). :class:`ClientProcesses` keeps
what each reported and owns the processes: closing it terminates, then kills, whatever still runs.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Set
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from waltz.chaos.worker import WorkerSpec, worker_main

__all__ = ["MOUNTED_STATES", "ClientProcess", "ClientProcesses"]

#: The states of a client process that has mounted every partition: ``running``, and the later
#: ones (a client not held by a fault may submit everything before the coordinator looks).
MOUNTED_STATES = frozenset({"running", "submitted", "done"})


@dataclass
class ClientProcess:
    """One client process and what it last reported.

    Attributes:
        index: the client's index (the writer number of its payloads).
        process: the process.
        conn: the coordinator's end of its pipe.
        planned: the transactions it submits at most.
        state: ``starting``, ``running``, ``submitted``, ``done`` or ``error``.
        acked: submissions acknowledged so far.
        failed: submissions failed so far.
        result_path: its JSON result file, once ``done``.
        error: what went wrong, in ``error``.
    """

    index: int
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    planned: int
    state: str = "starting"
    acked: int = 0
    failed: int = 0
    result_path: str | None = None
    error: str | None = None

    def handle(self, message: tuple[Any, ...]) -> None:
        """Take one message of the process into account."""
        kind = message[0]
        if kind == "ready":
            self.state = "running"
        elif kind == "progress":
            self.acked, self.failed = int(message[1]), int(message[2])
        elif kind == "submitted":
            self.acked, self.failed = int(message[1]), int(message[2])
            self.state = "submitted"
        elif kind == "done":
            self.state, self.result_path = "done", str(message[1])
        elif kind == "error":
            self.state, self.error = "error", str(message[1])

    @property
    def finished(self) -> bool:
        """True once it is done or failed."""
        return self.state in ("done", "error")


class ClientProcesses:
    """The client processes of a run (a context manager: closing stops every one of them).

    Args:
        specs: what each process does.
        stop: set by the coordinator to make the clients submit no more.
        gate: the fraction of its transactions each client may have submitted (fault points).
    """

    def __init__(self, specs: list[WorkerSpec], stop: Event, gate: Synchronized[float]) -> None:
        context = multiprocessing.get_context("spawn")
        self.clients: list[ClientProcess] = []
        try:
            for spec in specs:
                Path(spec.result_path).parent.mkdir(parents=True, exist_ok=True)
                parent, child = context.Pipe()
                process = context.Process(
                    target=worker_main, args=(spec, child, stop, gate), name=f"chaos-worker-{spec.index}"
                )
                process.start()
                child.close()
                self.clients.append(ClientProcess(spec.index, process, parent, spec.transactions))
        except BaseException:
            self.close()
            raise

    def pump(self, timeout: float) -> None:
        """Receive the processes' messages for up to ``timeout`` seconds; notice dead processes."""
        live = {c.conn: c for c in self.clients if not c.finished}
        if not live:
            return
        for conn in multiprocessing.connection.wait(list(live), timeout):
            client = live[conn]  # type: ignore[index]
            try:
                while client.conn.poll():
                    client.handle(client.conn.recv())
            except (EOFError, OSError):
                if not client.finished:
                    client.state = "error"
                    client.error = client.error or f"worker {client.index} exited ({client.process.exitcode})"
        for client in self.clients:
            if not client.finished and not client.process.is_alive():
                client.state = "error"
                client.error = (
                    f"worker {client.index} exited with code {client.process.exitcode} without a result"
                )

    def wait_states(self, states: Set[str], timeout: float, what: str) -> None:
        """Wait until every process is in one of ``states``.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the message lists the late ones).
            RuntimeError: a process failed (the message carries its error).
        """
        deadline = time.monotonic() + timeout
        while not all(c.state in states or c.state == "error" for c in self.clients):
            if time.monotonic() > deadline:
                late = [f"worker {c.index}: {c.state}" for c in self.clients if c.state not in states]
                raise TimeoutError(f"{what} not within {timeout:g}s: {', '.join(late)}")
            self.pump(0.5)
        self.raise_errors()

    def raise_errors(self) -> None:
        """Raise the errors of the processes that failed.

        Raises:
            RuntimeError: at least one failed.
        """
        errors = [c.error for c in self.clients if c.state == "error"]
        if errors:
            raise RuntimeError("; ".join(e or "?" for e in errors))

    def send(self, message: tuple[Any, ...]) -> None:
        """Send a message to every process."""
        for client in self.clients:
            client.conn.send(message)

    def close(self) -> None:
        """Wait briefly for finished processes, terminate then kill the others. Idempotent."""
        for client in self.clients:
            client.process.join(30 if client.state == "done" else 0.1)
            if client.process.is_alive():
                client.process.terminate()
                client.process.join(10)
            if client.process.is_alive():
                client.process.kill()
                client.process.join(5)
            client.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
