"""The SmallBank peers' worker processes: ``--processes`` x ``--threads``, each thread with its own
bank and its own seeded draws, in a closed loop.

Each thread runs ``--warmup`` draws (not measured), then its share of ``--transactions`` draws
once every process is ready; the measured phase stops early at ``--time-limit`` seconds. The
processes are spawned, so a peer's :data:`~benchmarks.peers.smallbank_bank.BackendFactory` is
pickled by reference; the CPU of the database's backends is read around the measured phase.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from benchmarks.peers.pg_server import Database, backend_cpu
from benchmarks.peers.smallbank_bank import BackendFactory, Bank
from benchmarks.peers.smallbank_tally import Tally
from benchmarks.peers.smallbank_workload import Mix, Options

#: Seconds the worker processes may take to connect and warm up before the measured phase.
SETUP_TIMEOUT = 120.0
#: Seconds beyond the time limit for the workers to report after the measured phase.
REPORT_GRACE = 120.0


def _run_draws(bank: Bank, mix: Mix, draws: int, tally: Tally, deadline: float) -> None:
    """Run ``draws`` operations one after the other (closed loop), stopping at ``deadline``."""
    for _ in range(draws):
        if time.monotonic() >= deadline:
            tally.time_limited += 1
            return
        op = mix.draw()
        begun = time.perf_counter()
        try:
            outcome = bank.execute(op)
        except Exception as exc:
            tally.error(op, exc)
            continue
        tally.record(op, outcome, time.perf_counter() - begun)


def _worker_process(
    factory: BackendFactory,
    database: Database,
    options: Options,
    index: int,
    go: Any,
    results: Any,
    close: Any,
) -> None:
    """One worker process: ``options.threads`` threads, each with its bank. They warm up; the
    process puts ``ready`` (or the setup's error) on ``results``, runs the measured draws once
    ``go`` is set, puts its tallies (measured and warm-up) on ``results``, and closes its
    connections once ``close`` is set."""
    try:
        backend = factory(database, options)
    except Exception:
        results.put({"index": index, "error": traceback.format_exc()})
        return
    threads = options.threads
    banks: list[Bank] = []
    setup_errors: list[str] = []
    measured = [Tally() for _ in range(threads)]
    warmed = [Tally() for _ in range(threads)]
    local_ready = threading.Barrier(threads + 1)
    start = threading.Event()
    guard = threading.Lock()
    deadline = float("inf")  # set before ``start``

    def thread_main(i: int) -> None:
        worker = index * threads + i
        mix = Mix(options, random.Random(f"{options.seed}-{worker}"))
        bank: Bank | None = None
        try:
            bank = backend.bank()
            with guard:
                banks.append(bank)
            _run_draws(bank, mix, options.share(options.warmup, worker), warmed[i], float("inf"))
        except Exception as exc:
            with guard:
                setup_errors.append(f"thread {worker}: {exc!r}")
            bank = None
        try:
            local_ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            return
        if bank is None or not start.wait(timeout=SETUP_TIMEOUT):
            return
        tally = measured[i]
        tally.stats.started = tally.stats.ended = time.time()
        _run_draws(bank, mix, options.share(options.transactions, worker), tally, deadline)
        tally.stats.ended = time.time()

    workers = [
        threading.Thread(target=thread_main, args=(i,), name=f"smallbank-{index}-{i}", daemon=True)
        for i in range(threads)
    ]
    try:
        for thread in workers:
            thread.start()
        try:
            local_ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            setup_errors.append(f"the threads were not ready within {SETUP_TIMEOUT:g} s")
        if setup_errors:
            local_ready.abort()
            results.put({"index": index, "error": "; ".join(setup_errors[:5])})
            return
        results.put({"index": index, "ready": True})
        for _ in range(int(SETUP_TIMEOUT / 0.1)):  # until ``go``, or ``close`` (the run failed)
            if go.wait(timeout=0.1) or close.is_set():
                break
        if not go.is_set():
            return
        cpu = time.process_time()
        deadline = time.monotonic() + options.time_limit
        start.set()
        for thread in workers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + REPORT_GRACE / 2)
        stuck = [thread.name for thread in workers if thread.is_alive()]
        total, warm = Tally(), Tally()
        for tally in measured:
            total.merge(tally)
        for tally in warmed:
            warm.merge(tally)
        total.stats.client_cpu_seconds = time.process_time() - cpu
        if stuck:
            total.stats.errors.append(f"threads still running at the end: {', '.join(stuck)}")
        results.put({"index": index, "measured": total.to_wire(), "warmup": warm.to_wire()})
        close.wait(timeout=REPORT_GRACE)
    finally:
        with guard:
            for bank in banks:
                with suppress(Exception):
                    bank.close()
        backend.close()


@dataclass
class Harvest:
    """The merged tallies of a run, and the CPU the database's backends spent in it.

    Attributes:
        measured: what the threads did in the measured phase, all processes merged.
        warmup: what they did in the warm-up (its money is in the money check).
        database_cpu_seconds: CPU seconds of the database's backends in the measured phase; None
            when the database runs on another machine.
    """

    measured: Tally
    warmup: Tally
    database_cpu_seconds: float | None


def _collect(results: Any, processes: list[Any], timeout: float) -> list[dict[str, Any]]:
    """One message from each worker process (in arrival order).

    Raises:
        RuntimeError: a worker reported an error, or ended without a message, or ``timeout``
            seconds passed.
    """
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(messages) < len(processes):
        try:
            message: dict[str, Any] = results.get(timeout=0.5)
        except queue.Empty:
            ended = [p.name for p in processes if p.exitcode is not None]
            if ended:
                raise RuntimeError(f"worker process(es) ended without reporting: {ended}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker processes silent for {timeout:g} s") from None
            continue
        if "error" in message:
            raise RuntimeError(f"worker process {message['index']} failed: {message['error']}")
        messages.append(message)
    return messages


def run_workers(factory: BackendFactory, database: Database, options: Options) -> Harvest:
    """Run the worker processes (``spawn``) against ``database``; their merged tallies.

    Args:
        factory: makes each process's backend; a module-level function.
        database: the run's database and its server, opened (every customer's accounts exist).
        options: the run.

    Returns:
        The tallies of the measured phase and of the warm-up, and the database's CPU.

    Raises:
        RuntimeError: a worker process failed to set up or to report.
    """
    context = multiprocessing.get_context("spawn")
    go, close = context.Event(), context.Event()
    results = context.Queue()
    processes = [
        context.Process(
            target=_worker_process,
            args=(factory, database, options, index, go, results, close),
            name=f"smallbank-worker-{index}",
            daemon=True,
        )
        for index in range(options.processes)
    ]
    try:
        for process in processes:
            process.start()
        _collect(results, processes, SETUP_TIMEOUT)  # every process ready
        before = backend_cpu(database.name, database.server)
        go.set()
        wires = _collect(results, processes, options.time_limit + REPORT_GRACE)
        after = backend_cpu(database.name, database.server)
    finally:
        close.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    measured, warmup = Tally(), Tally()
    for wire in sorted(wires, key=lambda w: int(w["index"])):
        measured.merge(Tally.from_wire(wire["measured"]))
        warmup.merge(Tally.from_wire(wire["warmup"]))
    spent = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items()) if after else None
    return Harvest(measured, warmup, spent)
