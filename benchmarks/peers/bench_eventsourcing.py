"""eventsourcing peer: the ``eventsourcing`` library on PostgreSQL (127.0.0.1:5432, user postgres).

The peer benchmark's workload (``waltz.perf.loadgen``: one write lock per transaction, the
writer's last-seen version as the concurrency check; docs/design/locks.md, "Optimistic locking
in Waltz") on an event store. One aggregate per lock of the pool (``Lock``, 1,000 of them,
created before the measured phase). A transaction triggers a ``Written`` event (the 200-byte
payload, as text) on the writer's last-seen copy of the aggregate and saves it: the event's
originator version is the last-seen version + 1, and the stored-events table's primary key
(originator_id, originator_version) is the optimistic concurrency check. On
``RecordConflictError`` the writer reloads the aggregate from the repository and retries (a
retry). Writers are ``--in-flight`` threads, each with a pooled connection.

A projection (``eventsourcing.projection.ProjectionRunner``) follows the application's
notification log in the same process and upserts one SQL row per lock together with its tracking
record, in one transaction (``PostgresTrackingRecorder``): the "apply" side, like a Waltz client's
callbacks. The figures are commit (event stored) figures; the projection's lag after the last
commit is reported beside them. The database is created for the run and dropped afterwards.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import singledispatchmethod
from typing import Any

import psycopg
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import RecordConflictError, Tracking
from eventsourcing.postgres import PostgresTrackingRecorder
from eventsourcing.projection import Projection, ProjectionRunner
from psycopg.sql import SQL, Composed

from benchmarks.peers.common import MAX_RETRIES, TooManyRetriesError, result
from benchmarks.peers.pg_server import LOCAL, PgServer, dsn, scratch_database
from waltz.perf.loadgen import LoadSpec, Outcome, Request, run_load

NAMESPACE = uuid.UUID("6f1d3c1e-9a7b-4e53-9c51-1c1b4a5f0b21")


def lock_uuid(lock_id: int) -> uuid.UUID:
    """The aggregate ID of lock ``lock_id`` (a UUID 5, the same in every run).

    Args:
        lock_id: the lock's number in the pool.

    Returns:
        Its aggregate's ID.
    """
    return uuid.uuid5(NAMESPACE, f"lock-{lock_id}")


class Lock(Aggregate):
    """One lock of the pool; its events are the transactions written under it.

    Args:
        lock_id: the lock's number in the pool.
    """

    def __init__(self, lock_id: int) -> None:
        self.lock_id = lock_id
        self.writes = 0

    @staticmethod
    def create_id(lock_id: int) -> uuid.UUID:
        """The aggregate's ID from its creation's arguments (the library calls it).

        Args:
            lock_id: the lock's number in the pool.

        Returns:
            :func:`lock_uuid` of it.
        """
        return lock_uuid(lock_id)

    class Written(Aggregate.Event):
        """A transaction written under the lock: its payload, as text."""

        data: str

    @event(Written)
    def write(self, data: str) -> None:
        """Event ``Written``: one transaction's payload written under the lock."""
        self.writes += 1


class Locks(Application[uuid.UUID]):
    """The application: saves ``Lock`` aggregates."""


class LockView(PostgresTrackingRecorder):
    """The SQL view: one row per lock (writes, last payload size), with tracking records.

    Takes the arguments of ``PostgresTrackingRecorder``; adds the ``lock_view`` table to the
    statements it creates its tables with.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sql_create_statements.append(
            Composed(
                [
                    SQL(
                        "CREATE TABLE IF NOT EXISTS lock_view "
                        "(lock_id uuid PRIMARY KEY, writes bigint, last_size int)"
                    )
                ]
            )
        )

    def record_write(self, lock_id: uuid.UUID, size: int, tracking: Tracking) -> None:
        """Count one write of a lock, and record the projection's position, in one transaction.

        Args:
            lock_id: the lock's aggregate ID.
            size: the payload's length in characters.
            tracking: the notification's position in the application's log.
        """
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(
                "INSERT INTO lock_view VALUES (%s, 1, %s) ON CONFLICT (lock_id) DO UPDATE "
                "SET writes = lock_view.writes + 1, last_size = EXCLUDED.last_size",
                (lock_id, size),
            )
            self._insert_tracking(curs, tracking)


class LockProjection(Projection[LockView]):
    """Projects ``Lock.Written`` events into ``lock_view``."""

    name = "lockview"
    topics = (f"{__name__}:Lock.Written",)

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        """Project one event: any event only moves the tracking position (``Lock.Written`` counts a write).

        Args:
            domain_event: the event.
            tracking: its position in the application's notification log.
        """
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: Lock.Written, tracking: Tracking) -> None:
        self.view.record_write(domain_event.originator_id, len(domain_event.data), tracking)


def env_for(dbname: str, pool: int, server: PgServer = LOCAL) -> dict[str, str]:
    """The applications' PostgreSQL settings, as their environment.

    Args:
        dbname: the run's database.
        pool: connections in the pool (4 more may overflow).
        server: the server the database is on; the local one by default.

    Returns:
        The settings, for the application and (prefixed ``LOCKVIEW_``) for the view.
    """
    base = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": dbname,
        "POSTGRES_HOST": server.host,
        "POSTGRES_PORT": str(server.port),
        "POSTGRES_USER": server.user,
        "POSTGRES_PASSWORD": "trust",
        "POSTGRES_POOL_SIZE": str(pool),
        "POSTGRES_MAX_OVERFLOW": "4",
    }
    return base | {f"LOCKVIEW_{k}": v for k, v in base.items()}


def es_submitter(
    app: Locks, pool: ThreadPoolExecutor
) -> Callable[[Request, Callable[[Outcome], None]], None]:
    """A submitter for ``waltz.perf.loadgen.run_load``: each request runs on a writer thread, writing on
    the last-seen aggregate; a conflict reloads it and retries.

    Args:
        app: the application.
        pool: the writer threads.

    Returns:
        The submitter.
    """
    seen: dict[int, Lock] = {}
    lock = threading.Lock()

    def job(request: Request) -> Outcome:
        lock_id = request.lock_id or 0
        data = request.payload.decode("latin-1")
        for retries in range(MAX_RETRIES):
            with lock:
                last = seen.get(lock_id)
            aggregate = copy.deepcopy(last) if last is not None else app.repository.get(lock_uuid(lock_id))
            aggregate.write(data)
            try:
                app.save(aggregate)
            except RecordConflictError:
                fresh: Lock = app.repository.get(lock_uuid(lock_id))
                with lock:
                    if lock_id not in seen or seen[lock_id].version < fresh.version:
                        seen[lock_id] = fresh
                continue
            with lock:
                if lock_id not in seen or seen[lock_id].version < aggregate.version:
                    seen[lock_id] = aggregate
            return Outcome(retries)
        return Outcome(MAX_RETRIES, TooManyRetriesError(f"lock {lock_id}: {MAX_RETRIES} conflicts"))

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        future = pool.submit(job, request)
        future.add_done_callback(
            lambda f: done(f.result() if f.exception() is None else Outcome(0, f.exception()))
        )

    return submit


def run(spec: LoadSpec, warmup: int = 300) -> dict[str, Any]:
    """Create a database, run the load with a projection following, drop the database.

    Args:
        spec: the load (its ``max_in_flight`` is the writer threads).
        warmup: transactions run before the measured ones (not measured).

    Returns:
        The result row (``common.result``'s keys, with ``projection_lag_s`` and ``projected_writes``).
    """
    threads = spec.max_in_flight
    with scratch_database("waltz_peer_es") as dbname:
        env = env_for(dbname, threads)
        app = Locks(env=env)
        try:
            app.save(*[Lock(i) for i in range(spec.lock_pool_size or 1)])
            with (
                ProjectionRunner(
                    application_class=Locks, projection_class=LockProjection, view_class=LockView, env=env
                ) as runner,
                ThreadPoolExecutor(threads, thread_name_prefix="es-writer") as pool,
            ):
                submit = es_submitter(app, pool)
                run_load(submit, LoadSpec(warmup, spec.payload_size, spec.lock_pool_size, spec.max_in_flight))
                stats = run_load(submit, spec)
                last = app.recorder.max_notification_id()
                waited = time.perf_counter()
                runner.wait(last, timeout=spec.timeout)
                lag = time.perf_counter() - waited
                with psycopg.connect(dsn(dbname)) as conn:
                    row = conn.execute("SELECT sum(writes) FROM lock_view").fetchone()
                projected = int(row[0]) if row and row[0] is not None else 0
        finally:
            app.close()
    settings = (
        f"PostgreSQL 15 defaults (synchronous_commit on, fsync per commit), {threads} writer threads "
        f"with pooled connections; projection in-process, lag after last commit {lag:.2f} s"
    )
    return result(
        "eventsourcing+PostgreSQL",
        "1 PostgreSQL 15 (no replication)",
        settings,
        spec,
        stats,
        projection_lag_s=round(lag, 3),
        projected_writes=projected,
    )
